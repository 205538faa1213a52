-- sw-pool: a pool as a module. `module load pool/<name>/<version>` mounts the pool and puts its
-- modulefiles on MODULEPATH; `module unload` (or purge) takes them off and releases the mount.
--
-- Install (make install puts this file at $(PREFIX)/share/sw-pool/lmod/pool-modulefile.lua):
--   mkdir -p <site modulefiles>/pool/<name>
--   ln -s $(PREFIX)/share/sw-pool/lmod/pool-modulefile.lua <site modulefiles>/pool/<name>/<version>.lua
-- The pool file is found on $SW_POOL_PATH (<dir>/<name>/<version>.sqfs or <dir>/<name>-<version>.sqfs,
-- or .ext4/.ext3/.ext2/.img) and mounted at $SW_POOL_MOUNT/<name>/<version> (default: your runtime
-- directory). Inside a Slurm job the mount is recorded with $SLURM_JOB_ID and the pool is added to
-- SW_POOL_LOAD, so that the TaskProlog mounts it on every node of the job's later steps. Set
-- SW_POOL_BIN to use a sw-pool that is not on PATH.
--
-- Load mounts synchronously (a failure is a module error, and nothing is changed); unload runs
-- `sw-pool umount` after Lmod has finished (Lmod's execute{}), so packages of the pool that are
-- still loaded can be unloaded first from the still-mounted directory.

local sw      = os.getenv("SW_POOL_BIN") or "sw-pool"
local name    = myModuleName():gsub("^pool/", "")
local version = myModuleVersion()
local key     = "__SW_POOL_MP_" .. (name .. "_" .. version):gsub("[^%w]", "_")

local function q(s)
   return "'" .. s:gsub("'", "'\\''") .. "'"
end

whatis("Name: pool " .. name)
whatis("Version: " .. version)
help("The sw-pool software pool " .. name .. "/" .. version .. ", mounted read-only with FUSE.")

local mp = os.getenv(key)
if mode() == "load" and not mp then
   local out = subprocess(sw .. " mount --print-mountpoint " .. q(name .. "/" .. version)
                          .. " 2>&1; echo \"SWPOOLEXIT=$?\"") or ""
   local rc = out:match("SWPOOLEXIT=(%d+)%s*$")
   out = out:gsub("SWPOOLEXIT=%d+%s*$", ""):gsub("%s+$", "")
   if rc ~= "0" then
      LmodError("sw-pool could not mount pool " .. name .. "/" .. version .. ":\n" .. out .. "\n")
   end
   mp = out:match("([^\n]*)$")
   -- what sw-pool said before the mount point (a warning about the pool's trust) is shown, not
   -- swallowed with the output
   local said = out:match("^(.*)\n[^\n]*$")
   if said and said:match("%S") then
      LmodMessage(said)
   end
end

if mp then
   setenv(key, mp)
   -- in a Slurm job, the job's later steps mount it on their nodes too (sw-pool's TaskProlog reads
   -- SW_POOL_LOAD; see README, "For admins: Slurm"); unload takes it off again
   if os.getenv("SLURM_JOB_ID") then
      append_path{"SW_POOL_LOAD", name .. "/" .. version, delim = ","}
   end
   prepend_path("MODULEPATH", pathJoin(mp, "modulefiles"))
   -- the paper's modulefiles read GWDG_SW_MOUNT, generated ones SW_POOL_MOUNT: <root> of <root>/<name>/<version>
   local root = mp:match("^(.*)/[^/]+/[^/]+$")
   if root and mp == pathJoin(root, name, version) then
      pushenv("SW_POOL_MOUNT", root)
      pushenv("GWDG_SW_MOUNT", root)
   end
   -- no redirection: the command must parse in every shell Lmod supports (sh, csh, fish)
   execute{cmd = sw .. " umount -q " .. q(mp), modeA = {"unload"}}
end

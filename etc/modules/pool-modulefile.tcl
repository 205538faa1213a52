#%Module1.0
## sw-pool: a pool as a module, for Environment Modules (4.x, 5.x; Tcl). `module load
## pool/<name>/<version>` mounts the pool and puts its modulefiles on MODULEPATH; `module unload`
## (or purge) takes them off and releases the mount. The same semantics as the Lmod version
## (pool-modulefile.lua).
##
## Install (make install puts this file at $(PREFIX)/share/sw-pool/modules/pool-modulefile.tcl):
##   mkdir -p <site modulefiles>/pool/<name>
##   ln -s $(PREFIX)/share/sw-pool/modules/pool-modulefile.tcl <site modulefiles>/pool/<name>/<version>
## The pool file is found on $SW_POOL_PATH and mounted at $SW_POOL_MOUNT/<name>/<version> (default:
## your runtime directory). Inside a Slurm job the pool is added to SW_POOL_LOAD, so that the
## TaskProlog mounts it on every node of the job's later steps. Set SW_POOL_BIN to use a sw-pool
## that is not on PATH.

set sw sw-pool
if {[info exists ::env(SW_POOL_BIN)] && $::env(SW_POOL_BIN) ne {}} {
    set sw $::env(SW_POOL_BIN)
}
if {![regexp {^pool/(.+)/([^/]+)$} [module-info name] -> name version]} {
    error "sw-pool: this modulefile must be installed as pool/<name>/<version> (it is [module-info name])"
}
set key __SW_POOL_MP_[regsub -all {[^A-Za-z0-9]} ${name}_$version _]

module-whatis "Name: pool $name"
module-whatis "Version: $version"
proc ModulesHelp {} {
    puts stderr "A sw-pool software pool, mounted read-only with FUSE."
}

if {[info exists ::env($key)]} {
    set mp $::env($key)
} elseif {[module-info mode load]} {
    # mount synchronously: a failure is a module error, and nothing is changed
    if {[catch {exec $sw mount --print-mountpoint $name/$version 2>@stderr} out]} {
        error "sw-pool could not mount pool $name/$version:\n$out"
    }
    set mp [lindex [split [string trim $out] \n] end]
}

if {[info exists mp]} {
    setenv $key $mp
    # in a Slurm job, the job's later steps mount it on their nodes too (sw-pool's TaskProlog
    # reads SW_POOL_LOAD); unload takes it off again
    if {[info exists ::env(SLURM_JOB_ID)]} {
        append-path -d , SW_POOL_LOAD $name/$version
    }
    prepend-path MODULEPATH [file join $mp modulefiles]
    # the paper's modulefiles read GWDG_SW_MOUNT, generated ones SW_POOL_MOUNT: <root> of
    # <root>/<name>/<version>
    set root [file dirname [file dirname $mp]]
    if {[file join $root $name $version] eq $mp} {
        pushenv SW_POOL_MOUNT $root
        pushenv GWDG_SW_MOUNT $root
    }
    if {[module-info mode unload]} {
        if {[catch {exec $sw umount -q $mp 2>@stderr} out]} {
            puts stderr "sw-pool: could not release pool $name/$version at $mp: $out"
        }
    }
}

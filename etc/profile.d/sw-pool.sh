# shellcheck shell=sh
# sw-pool shell integration (installed as /etc/profile.d/sw-pool.sh by `make install`; the same
# function is what `sw-pool shell-init bash|zsh|ksh` prints, for ~/.bashrc: eval "$(sw-pool shell-init bash)").
#
# Like Lmod's `module` function: `sw-pool load POOL`, `sw-pool unload POOL` and `sw-pool env MOUNTPOINT`
# print shell code (MODULEPATH, SW_POOL_MOUNT, GWDG_SW_MOUNT, SW_POOL_LOADED) that this function
# evaluates in the calling shell; every other subcommand runs unchanged. Messages go to stderr; only a
# successful command's standard output is evaluated. bash, zsh and ksh only: POSIX sh cannot name a
# function `sw-pool` (there, use `eval "$(sw-pool env DIR)"`). bash exports it (as Lmod's `module`),
# so that a bash started from this one (a job script without -l, `bash` typed in a terminal, `sw-pool
# shell`) has it too; zsh and ksh cannot export functions: put the line in ~/.zshenv or ~/.kshrc.
if [ -n "${BASH_VERSION-}${ZSH_VERSION-}${KSH_VERSION-}" ]; then
  eval '
sw-pool() {
  typeset __swp_sub="" __swp_skip="" __swp_a __swp_out __swp_rc
  for __swp_a in "$@"; do
    if [ -n "$__swp_skip" ]; then __swp_skip=""; continue; fi
    case "$__swp_a" in
      --log) __swp_skip=1 ;;
      -h|--help|-V|--version|--json) __swp_sub=""; break ;;
      -*) ;;
      *) [ -z "$__swp_sub" ] && __swp_sub="$__swp_a" ;;
    esac
  done
  case "$__swp_sub" in
    load|unload|env)
      __swp_out=$(SW_POOL_SHELL=sh SW_POOL_SHELL_FUNCTION=1 command sw-pool "$@")
      __swp_rc=$?
      if [ "$__swp_rc" -eq 0 ]; then eval "$__swp_out"; fi
      return "$__swp_rc" ;;
    *) command sw-pool "$@" ;;
  esac
}'
  # shellcheck disable=SC3045 # bash only, as the test says
  if [ -n "${BASH_VERSION-}" ]; then export -f sw-pool; fi
fi
# Completion in an interactive bash, without the bash-completion package: the first <TAB> after
# `sw-pool` loads the script `sw-pool generate completions bash` prints (clap's completions, then
# pool names from pool_path, loaded pools and layer names). A completion already set up (by
# bash-completion, or earlier) is left alone.
if [ -n "${BASH_VERSION-}" ]; then
  case $- in
    *i*)
      # shellcheck disable=SC3044 # bash only, as the test says
      if ! complete -p sw-pool >/dev/null 2>&1; then
        eval '
_sw_pool_first_tab() {
  complete -r sw-pool
  eval "$(command sw-pool generate completions bash 2>/dev/null)"
  if declare -F _sw_pool_complete >/dev/null; then _sw_pool_complete "$@"; fi
}'
        # shellcheck disable=SC3044 # bash only, as the test says
        complete -F _sw_pool_first_tab -o bashdefault -o default sw-pool
      fi ;;
  esac
fi

# sw-pool shell integration for fish: `sw-pool shell-init fish | source` (in ~/.config/fish/config.fish).
# `sw-pool load POOL`, `sw-pool unload POOL` and `sw-pool env MOUNTPOINT` print fish code that this
# function evaluates in the calling shell; every other subcommand runs unchanged.
function sw-pool --description 'sw-pool: load, unload and env change this shell'
    set -l sub
    set -l skip 0
    for a in $argv
        if test $skip = 1
            set skip 0
            continue
        end
        switch $a
            case --log
                set skip 1
            case -h --help -V --version --json
                set sub ''
                break
            case '-*'
            case '*'
                if test -z "$sub"
                    set sub $a
                end
        end
    end
    switch "$sub"
        case load unload env
            set -l out (env SW_POOL_SHELL=fish SW_POOL_SHELL_FUNCTION=1 sw-pool $argv | string collect)
            set -l rc $pipestatus[1]
            if test $rc -eq 0
                eval $out
            end
            return $rc
        case '*'
            command sw-pool $argv
    end
end

alias sw-pool 'eval "`env SW_POOL_SHELL=csh SW_POOL_SHELL_FUNCTION=1 sw-pool shell-exec csh \!*`"'

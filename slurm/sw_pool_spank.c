/*
 * sw-pool SPANK plugin: `--pool=NAME/VERSION[,NAME/VERSION...]` and `--layer=NAME` for sbatch,
 * salloc and srun.
 *
 * The pools are loaded on every node of the job with one MPI broadcast each before the user's first
 * task starts, and released at the end of the job by sw-pool's Slurm epilog. Bad values fail at
 * submission.
 *
 *   plugstack.conf:  optional /usr/local/lib/sw-pool/sw_pool_spank.so [sw-pool=/usr/local/bin/sw-pool]
 *
 * How (all the work is sw-pool's; this file only wires it to Slurm):
 *  - submission (sbatch, salloc, srun; local/allocator context): the option's syntax is checked
 *    here, then `sw-pool slurm check-pools LIST` checks that every pool exists and passes the trust
 *    policy (its message is the submission's error). The list goes into the job's environment as
 *    SW_POOL_SPANK_POOLS and is added to SW_POOL_LOAD (which the TaskProlog mounts in every step);
 *  - sbatch: in the batch step (remote context, slurm_spank_user_init) the plugin marks the step
 *    (SW_POOL_SPANK_STEP=batch); sw-pool's TaskProlog then runs the broadcast (`sw-pool load`
 *    spread over the allocation by `srun --overlap`) before the script starts, and exports
 *    SW_POOL_SPANK_DONE=<job> so that the script's steps do not repeat it;
 *  - srun (a new job, or a step of an salloc/sbatch job not yet broadcast): in srun itself, after
 *    the allocation and before the step's tasks are launched (slurm_spank_local_user_init), the
 *    plugin runs `sw-pool slurm broadcast --job-id J --nodes N LIST` and waits for it;
 *  - every TaskProlog then finds the pools in the node's cache and mounted for the job (no read of
 *    shared storage), and puts their modules on MODULEPATH.
 *
 * `--layer=NAME` (seed 003: the user "just issues the run command to the job management system"):
 * every task of the job's steps runs as `sw-pool run --layer NAME -- TASK...` (the layer synced to
 * the step's nodes by sw-pool itself, the tasks of a node in one environment). In the task, just
 * before its exec (slurm_spank_task_init), the plugin makes the task's program sw-pool and puts
 * PID:PROGRAM in SW_POOL_SPANK_EXEC (PID: the task's, which its exec keeps), which sw-pool reads
 * first and removes; other programs of the task (the TaskProlog: another pid) ignore it. The batch script itself
 * runs outside (it starts the steps); its steps' tasks run inside.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(sw_pool, 1);

#define ENV_POOLS "SW_POOL_SPANK_POOLS"
#define ENV_STEP "SW_POOL_SPANK_STEP"
#define ENV_DONE "SW_POOL_SPANK_DONE"
#define ENV_LOAD "SW_POOL_LOAD"
#define ENV_LAYER "SW_POOL_SPANK_LAYER"
#define ENV_EXEC "SW_POOL_SPANK_EXEC"
#define MAX_LIST 4096
#define MAX_LAYER 64

static char sw_bin[1024] = "sw-pool";
static char pools[MAX_LIST];
static int have_pools;
static char layer[MAX_LAYER + 1];
static int have_layer;

/* NAME/VERSION: one '/', both parts non-empty, [A-Za-z0-9._+-], not starting with '.' */
static int valid_spec(const char *s, size_t n, char *why, size_t wl)
{
	size_t slash = n, i;
	if (n == 0) {
		snprintf(why, wl, "an empty entry");
		return 0;
	}
	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '/') {
			if (slash != n) {
				snprintf(why, wl, "'%.*s' has more than one '/'", (int)n, s);
				return 0;
			}
			slash = i;
		} else if (!(isalnum(c) || c == '.' || c == '_' || c == '+' || c == '-')) {
			snprintf(why, wl, "'%.*s' contains '%c'", (int)n, s, isprint(c) ? c : '?');
			return 0;
		}
	}
	if (slash == n || slash == 0 || slash == n - 1 || s[0] == '.' || s[slash + 1] == '.') {
		snprintf(why, wl, "'%.*s' is not NAME/VERSION", (int)n, s);
		return 0;
	}
	return 1;
}

static int check_list(const char *list, char *why, size_t wl)
{
	const char *p = list;
	if (strlen(list) >= MAX_LIST) {
		snprintf(why, wl, "the list is longer than %d characters", MAX_LIST - 1);
		return 0;
	}
	for (;;) {
		const char *e = strchr(p, ',');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (!valid_spec(p, n, why, wl))
			return 0;
		if (!e)
			return 1;
		p = e + 1;
	}
}

static int run_sw_pool(char *const argv[]);

/* This process runs inside a job whose --pool pools were already broadcast. */
static int already_done(void)
{
	const char *done = getenv(ENV_DONE), *job = getenv("SLURM_JOB_ID");
	return done && job && *done && strcmp(done, job) == 0;
}

/* The option's value, in every context. At submission (sbatch, salloc, srun: not remote) the pools
 * must also exist and pass the trust policy; then they go into the job's environment. (Errors of
 * slurm_spank_init_post_opt do not stop sbatch or salloc; an option callback's do.) */
static int opt_pool(int val, const char *optarg, int remote)
{
	char why[256];
	(void)val;
	if (!optarg || !*optarg) {
		slurm_error("sw-pool: --pool needs NAME/VERSION[,NAME/VERSION...]");
		return -1;
	}
	if (!check_list(optarg, why, sizeof why)) {
		slurm_error("sw-pool: --pool=%s: %s; give NAME/VERSION[,NAME/VERSION...] of pools on $SW_POOL_PATH",
			    optarg, why);
		return -1;
	}
	snprintf(pools, sizeof pools, "%s", optarg);
	have_pools = 1;
	if (!remote && already_done()) {
		/* an srun inside a job whose pools were checked and broadcast (sbatch passes the
		 * option on to every srun of the job) */
		return 0;
	}
	if (!remote) {
		char merged[2 * MAX_LIST + 2];
		const char *load = getenv(ENV_LOAD);
		char *argv[] = { sw_bin, "slurm", "check-pools", pools, NULL };
		if (run_sw_pool(argv) != 0) {
			slurm_error("sw-pool: --pool=%s refused (see above)", pools);
			return -1;
		}
		if (load && *load && !strstr(load, pools))
			snprintf(merged, sizeof merged, "%s,%s", load, pools);
		else
			snprintf(merged, sizeof merged, "%s", load && *load ? load : pools);
		setenv(ENV_LOAD, merged, 1);
		setenv(ENV_POOLS, pools, 1);
	}
	return 0;
}

static struct spank_option pool_option = {
	"pool", "NAME/VERSION[,...]",
	"Load these sw-pool pools on every node of the job (one MPI broadcast each) before its first task",
	1, 0, (spank_opt_cb_f)opt_pool,
};

/* A layer name as sw-pool takes it: [A-Za-z0-9._-], not starting with '.', 1 to 64 characters. */
static int valid_layer(const char *s, char *why, size_t wl)
{
	size_t i, n = strlen(s);
	if (n == 0 || n > MAX_LAYER) {
		snprintf(why, wl, "a layer name has 1 to %d characters", MAX_LAYER);
		return 0;
	}
	if (s[0] == '.') {
		snprintf(why, wl, "a layer name does not start with '.'");
		return 0;
	}
	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (!(isalnum(c) || c == '.' || c == '_' || c == '-')) {
			snprintf(why, wl, "'%s' contains '%c'", s, isprint(c) ? c : '?');
			return 0;
		}
	}
	return 1;
}

static int opt_layer(int val, const char *optarg, int remote)
{
	char why[128];
	(void)val;
	if (!optarg || !valid_layer(optarg, why, sizeof why)) {
		slurm_error("sw-pool: --layer=%s: %s; give the name of one of your layers (`sw-pool layer list`)",
			    optarg ? optarg : "", optarg ? why : "a layer name is needed");
		return -1;
	}
	snprintf(layer, sizeof layer, "%s", optarg);
	have_layer = 1;
	if (!remote)
		setenv(ENV_LAYER, layer, 1);
	return 0;
}

static struct spank_option layer_option = {
	"layer", "NAME",
	"Run every task of the job's steps in an sw-pool environment with this writable layer (sw-pool run --layer NAME)",
	1, 0, (spank_opt_cb_f)opt_layer,
};

/* sw_bin as an absolute path: itself when it has a '/', else found on the job's PATH. */
static int sw_bin_path(spank_t sp, char *out, size_t ol)
{
	char path[4096], *p, *save = NULL;
	if (strchr(sw_bin, '/')) {
		snprintf(out, ol, "%s", sw_bin);
		return 0;
	}
	if (spank_getenv(sp, "PATH", path, sizeof path) != ESPANK_SUCCESS)
		snprintf(path, sizeof path, "/usr/local/bin:/usr/bin:/bin");
	for (p = strtok_r(path, ":", &save); p; p = strtok_r(NULL, ":", &save)) {
		snprintf(out, ol, "%s/%s", p, sw_bin);
		if (access(out, X_OK) == 0)
			return 0;
	}
	return -1;
}

/* Run sw-pool with ARGV (argv[0] is replaced by the configured binary); stderr is the caller's.
 * Returns its exit status, or -1 if it could not be run. */
static int run_sw_pool(char *const argv[])
{
	pid_t pid = fork();
	int st;
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int fd = open("/dev/null", O_RDONLY);
		if (fd >= 0) {
			dup2(fd, 0);
			close(fd);
		}
		execvp(sw_bin, argv);
		fprintf(stderr, "sw-pool: cannot run %s: %s (set sw-pool=PATH in plugstack.conf)\n",
			sw_bin, strerror(errno));
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0) {
		if (errno != EINTR)
			return -1;
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	int i;
	for (i = 0; i < ac; i++) {
		if (strncmp(av[i], "sw-pool=", 8) == 0)
			snprintf(sw_bin, sizeof sw_bin, "%s", av[i] + 8);
		else
			slurm_error("sw-pool: unknown plugstack.conf argument '%s' (known: sw-pool=PATH)", av[i]);
	}
	if (spank_option_register(sp, &pool_option) != ESPANK_SUCCESS) {
		slurm_error("sw-pool: cannot register --pool");
		return -1;
	}
	if (spank_option_register(sp, &layer_option) != ESPANK_SUCCESS) {
		slurm_error("sw-pool: cannot register --layer");
		return -1;
	}
	return 0;
}

/* A task of a step, just before its exec: with --layer, its program becomes sw-pool, which runs
 * the program in the environment (`sw-pool run --layer NAME -- PROGRAM ARGS...`). */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	uint32_t step = 0;
	int argc = 0;
	char **argv = NULL, env_layer[MAX_LAYER + 1], why[128], bin[4096], exec_var[8192];
	const char *l = NULL;
	(void)ac;
	(void)av;
	if (!spank_remote(sp))
		return 0;
	if (have_layer)
		l = layer;
	else if (spank_getenv(sp, ENV_LAYER, env_layer, sizeof env_layer) == ESPANK_SUCCESS && *env_layer)
		l = env_layer;
	if (!l)
		return 0;
	if (spank_get_item(sp, S_JOB_STEPID, &step) == ESPANK_SUCCESS && step == SLURM_BATCH_SCRIPT)
		return 0; /* the batch script starts the steps; their tasks run inside */
	if (!valid_layer(l, why, sizeof why)) {
		slurm_error("sw-pool: --layer=%s: %s", l, why);
		return -1;
	}
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1 || !argv || !argv[0]) {
		slurm_error("sw-pool: --layer=%s: cannot get the task's command", l);
		return -1;
	}
	if (sw_bin_path(sp, bin, sizeof bin) != 0) {
		slurm_error("sw-pool: --layer=%s: %s is not on the job's PATH (set sw-pool=PATH in plugstack.conf)",
			    l, sw_bin);
		return -1;
	}
	{
		/* sw-pool's own steps (a layer sync, a load) run sw-pool itself: never wrapped */
		struct stat a, b;
		if (stat(argv[0], &a) == 0 && stat(bin, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
			return 0;
	}
	if ((size_t)snprintf(exec_var, sizeof exec_var, "%ld:%s", (long)getpid(), argv[0]) >= sizeof exec_var) {
		slurm_error("sw-pool: --layer=%s: the task's program path is too long", l);
		return -1;
	}
	if (spank_setenv(sp, ENV_EXEC, exec_var, 1) != ESPANK_SUCCESS ||
	    spank_setenv(sp, ENV_LAYER, l, 1) != ESPANK_SUCCESS) {
		slurm_error("sw-pool: --layer=%s: cannot set the task's environment", l);
		return -1;
	}
	argv[0] = strdup(bin);
	return argv[0] ? 0 : -1;
}

/* srun, after the allocation, before the tasks: the broadcast, unless the job already had it. */
int slurm_spank_local_user_init(spank_t sp, int ac, char **av)
{
	uint32_t job = 0, nnodes = 0;
	char jobs[32], nodes[32];
	const char *list = have_pools ? pools : getenv(ENV_POOLS);
	const char *done = getenv(ENV_DONE);
	int rc;
	(void)ac;
	(void)av;
	if (!list || !*list)
		return 0;
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_NNODES, &nnodes) != ESPANK_SUCCESS) {
		slurm_error("sw-pool: --pool: cannot get the job id and node count from srun");
		return -1;
	}
	snprintf(jobs, sizeof jobs, "%u", job);
	snprintf(nodes, sizeof nodes, "%u", nnodes);
	if (done && strcmp(done, jobs) == 0)
		return 0;
	{
		char *argv[] = { sw_bin, "slurm", "broadcast", "--job-id", jobs, "--nodes", nodes,
				 (char *)list, NULL };
		rc = run_sw_pool(argv);
	}
	if (rc != 0) {
		slurm_error("sw-pool: --pool=%s: the broadcast to the job's %s node(s) failed (status %d)",
			    list, nodes, rc);
		return -1;
	}
	setenv(ENV_DONE, jobs, 1);
	return 0;
}

/* The batch step: mark it, so that sw-pool's TaskProlog broadcasts before the script starts. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	uint32_t step = 0;
	char buf[MAX_LIST];
	(void)ac;
	(void)av;
	if (!spank_remote(sp))
		return 0;
	if (spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS || step != SLURM_BATCH_SCRIPT)
		return 0;
	if (!have_pools && spank_getenv(sp, ENV_POOLS, buf, sizeof buf) != ESPANK_SUCCESS)
		return 0;
	if (spank_setenv(sp, ENV_STEP, "batch", 1) != ESPANK_SUCCESS) {
		slurm_error("sw-pool: cannot set %s in the batch step", ENV_STEP);
		return -1;
	}
	return 0;
}

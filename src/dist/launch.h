/*
 * launch.h — the launcher: `dplua --nproc_per_node=N script.lua args...`.
 *
 * src/main.c hands the whole command line here when it meets a launcher
 * flag. The launcher starts the ranks of this node (the same dplua
 * program, /proc/self/exe), with the env:// variables that torchrun sets,
 * passes their output through line by line, and ends them all when one
 * fails. docs/DISTRIBUTED.md ("Launcher") describes the flags and the
 * environment.
 *
 *     if (is_launcher_flag(argv[1]))
 *         return dp_launch_main(argc, argv);   // the process exit status
 */
#ifndef DP_DIST_LAUNCH_H
#define DP_DIST_LAUNCH_H

/* Runs the launcher on the whole command line (argv[0] is the program,
 * argv[1] the first launcher flag). Returns the exit status: 0 when every
 * rank exited 0; the status of the first rank that failed (128 + signal
 * number when a signal killed it); 128 + the signal when the launcher was
 * interrupted; 2 for a bad command line; 1 when the ranks could not be
 * started. */
int dp_launch_main(int argc, char **argv);

/* Whether arg ("--nproc-per-node=4", "--tee") is a flag the launcher
 * takes, spelt with '_' or '-'. */
int dp_launch_is_flag(const char *arg);

#endif /* DP_DIST_LAUNCH_H */

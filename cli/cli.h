/* One function per subcommand; each gets argv starting at its own name and
 * returns the process exit code (0 ok, 1 runtime failure, 2 usage error). */
#pragma once
#include <stdio.h>

#define MTRAIN_VERSION "0.1.0"

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
};

int cmd_pretrain(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_env(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_version(int argc, char **argv);
int cmd_help(int argc, char **argv);

/* Defined in main.c: the command table. */
const struct command *find_command(const char *name);
void print_commands(FILE *out);
void print_usage(FILE *out);
/* True if argv[1..] contains --help or -h. */
int wants_help(int argc, char **argv);

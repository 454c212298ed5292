/* mtrain: subcommand dispatch only. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "kernels/cpu/blas_check.h"

static const struct command commands[] = {
    {"pretrain", cmd_pretrain, "train a model from a YAML recipe"},
    {"data", cmd_data, "build, import, inspect and verify token datasets"},
    {"convert", cmd_convert, "reshard a checkpoint, show its manifest, export to Hugging Face"},
    {"generate", cmd_generate, "continue a prompt with a trained model (greedy or sampled, KV cache)"},
    {"eval", cmd_eval, "loss and perplexity over a dataset split, or per-token losses of given ids"},
    {"plan", cmd_plan, "choose a parallel layout for N GPUs: memory and step time of every layout, ranked"},
    {"env", cmd_env, "what this build and each rank see: CUDA, BLAS, MPI, NCCL, GPU binding"},
    {"version", cmd_version, "print the version"},
    {"help", cmd_help, "show help for mtrain or a subcommand"},
};

const struct command *find_command(const char *name) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

void print_commands(FILE *out) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    blas_fix_core(argv); /* before any thread: may exec mtrain again with OPENBLAS_CORETYPE set */
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) return cmd_help(argc - 1, argv + 1);
    if (!strcmp(argv[1], "--version")) return cmd_version(argc - 1, argv + 1);
    const struct command *c = find_command(argv[1]);
    if (!c) {
        fprintf(stderr, "mtrain: error: unknown command '%s'\n\n", argv[1]);
        print_usage(stderr);
        return 2;
    }
    int rc = c->run(argc - 1, argv + 1);
    /* what a command printed must have reached its file (e.g. `eval --dump -` into a full disk) */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "mtrain: error: cannot write the output: %s\n", strerror(errno ? errno : EIO));
        return rc ? rc : 1;
    }
    return rc;
}

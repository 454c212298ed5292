#include <string.h>

#include "cli/cli.h"
#include "config/recipe.h"

void print_usage(FILE *out) {
    fprintf(out,
            "usage: mtrain <command> [args]\n\n"
            "commands:\n");
    print_commands(out);
    fprintf(out,
            "\n'mtrain help <command>' shows a command's options;"
            " 'mtrain help recipe' lists every recipe key.\n");
}

int wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

int cmd_help(int argc, char **argv) {
    if (argc < 2) {
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        printf("usage: mtrain help [COMMAND | recipe]\n\n"
               "  no argument  list the commands\n"
               "  COMMAND      the options of one command (same as 'mtrain COMMAND --help')\n"
               "  recipe       every recipe key with its type, default, range and meaning\n");
        return 0;
    }
    if (!strcmp(argv[1], "recipe")) {
        recipe_print_schema(stdout);
        return 0;
    }
    const struct command *c = find_command(argv[1]);
    if (!c) {
        fprintf(stderr, "mtrain: error: no help for unknown command '%s'\n", argv[1]);
        return 2;
    }
    char *args[] = {argv[1], "--help", NULL};
    return c->run(2, args);
}

int cmd_version(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        printf("usage: mtrain version\n\nPrint mtrain's version (also: mtrain --version).\n");
        return 0;
    }
    printf("mtrain %s\n", MTRAIN_VERSION);
    return 0;
}

/* specd-client.h — what specd-client's files share: the parsed options
 * (specd-client.c), the result as JSON and the interrupt flag
 * (specd-client.c), and the --jobs mode (specd-client-jobs.c). */
#ifndef SPECD_CLIENT_CLI_H
#define SPECD_CLIENT_CLI_H

#include "specd/client.h"
#include "specd/client_opts.h"

#include <cjson/cJSON.h>
#include <signal.h>

typedef struct options {
    sd_client_link_opts link; /* --coordinator, and the key files (specd-keygen) */
    const char *prompt, *system, *jobs, *out;
    const char *stop[SD_MAX_STOP_STRINGS];
    size_t n_stop;
    sd_client_request req;
    bool json, stats, verbose;
    double timeout_s, wait_ready_s;
    int concurrency;
    /* structured output: at most one of --json-schema FILE, --regex RE,
     * --grammar FILE, --response-json; con_text is the file read (owned) */
    const char *schema_path, *grammar_path, *regex;
    bool response_json;
    char *con_text;
} options;

/* Set by SIGINT/SIGTERM; the modes poll it. */
extern volatile sig_atomic_t cli_interrupted;

/* r as the JSON object --json and --jobs print (caller deletes it). */
cJSON *cli_result_json(const sd_client_result *r);

/* Sets o->req's constraint from the structured-output options (reading
 * the file into o->con_text): 0, or 2 with a message on stderr. */
int cli_constraint_load(options *o);

/* --jobs: runs every line of o->jobs; the exit status (0, or 1 when any
 * job failed). */
int cli_run_jobs(sd_client *c, const options *o);

#endif

/* chat_cli.c — drives specd's chat-template formatter for the jinja2 oracle
 * (tests/ref/test_chat_templates.py).
 *
 *   chat_cli TEMPLATE_FILE      recognise the template text in the file
 *   chat_cli --name NAME        the family NAME (the --chat-template override)
 *
 * Prints one JSON line {"family": NAME} or {"error": ...} (exit 3) for the
 * template, then answers each stdin line, a JSON case
 *   {"messages": [{"role":..,"content":..}], "add_generation_prompt": bool,
 *    "bos": "<s>", "eos": "</s>", "drop_bos": bool}
 * with {"text": ...} or {"refused": reason}. With "tools_api": true the
 * case goes through sd_chat_template_format_tools: "tools_json" (the tools
 * as JSON text), each message's "tool_calls_json" (its calls) and
 * "tool_call_id" (a tool turn's). JSON keeps any byte sequence
 * intact both ways, which a line protocol over raw text would not. */
#include "specd/chat.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    *len = n;
    return buf;
}

static void print_json(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    if (s) puts(s);
    free(s);
    cJSON_Delete(o);
    fflush(stdout);
}

static const char *str_field(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Formats one case; the reply is printed. */
static void run_case(sd_chat_template *t, const cJSON *c) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c, "messages");
    int n = cJSON_GetArraySize(msgs);
    sd_chat_msg *m = calloc(n > 0 ? (size_t)n : 1, sizeof *m);
    cJSON *reply = cJSON_CreateObject();
    const char **calls = calloc(n > 0 ? (size_t)n : 1, sizeof *calls);
    const char **ids = calloc(n > 0 ? (size_t)n : 1, sizeof *ids);
    int i = 0;
    for (const cJSON *e = msgs ? msgs->child : NULL; e && m && calls && ids; e = e->next, i++) {
        m[i] = (sd_chat_msg){str_field(e, "role"), str_field(e, "content")};
        calls[i] = str_field(e, "tool_calls_json");
        ids[i] = str_field(e, "tool_call_id");
    }
    bool gen = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt"));
    bool drop = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "drop_bos"));
    bool tools = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "tools_api"));
    sd_chat_tools tt = {str_field(c, "tools_json"), calls, ids};
    char err[512], *text = NULL;
    sd_status st = m && calls && ids ? sd_chat_template_set_tokens(t, str_field(c, "bos"), str_field(c, "eos"), drop)
                                     : SD_ERR_NOMEM;
    if (st == SD_OK && tools)
        st = sd_chat_template_format_tools(t, m, (size_t)n, &tt, gen, &text, NULL, err, sizeof err);
    else if (st == SD_OK)
        st = sd_chat_template_format(t, m, (size_t)n, gen, &text, err, sizeof err);
    if (st == SD_OK)
        cJSON_AddStringToObject(reply, "text", text);
    else
        cJSON_AddStringToObject(reply, "refused", st == SD_ERR_INVALID_ARG ? err : sd_status_str(st));
    free(text);
    free(m);
    free(calls);
    free(ids);
    print_json(reply);
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "--name") == 0 && argc < 3)) {
        fprintf(stderr, "usage: chat_cli TEMPLATE_FILE | --name NAME  (cases as JSON lines on stdin)\n");
        return 2;
    }
    sd_chat_template *t = NULL;
    sd_status st;
    if (strcmp(argv[1], "--name") == 0) {
        st = sd_chat_template_named(argv[2], &t);
    } else {
        size_t len = 0;
        char *text = read_all(argv[1], &len);
        if (!text) {
            fprintf(stderr, "chat_cli: cannot read %s\n", argv[1]);
            return 2;
        }
        st = sd_chat_template_parse(text, len, &t);
        free(text);
    }
    cJSON *head = cJSON_CreateObject();
    if (st != SD_OK) {
        cJSON_AddStringToObject(head, "error", sd_status_str(st));
        print_json(head);
        return 3;
    }
    cJSON_AddStringToObject(head, "family", sd_chat_template_name(t));
    const char *sys = sd_chat_template_default_system(t);
    if (sys) cJSON_AddStringToObject(head, "default_system", sys);
    print_json(head);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, stdin)) > 0) {
        cJSON *c = cJSON_ParseWithLength(line, (size_t)got);
        if (!c) {
            fprintf(stderr, "chat_cli: a case is not JSON\n");
            break;
        }
        run_case(t, c);
        cJSON_Delete(c);
    }
    free(line);
    sd_chat_template_free(&t);
    return 0;
}

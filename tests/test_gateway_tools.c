/* test_gateway_tools.c — tool calls read from a model's answer in each
 * family's syntax (gateway/tool_formats.c) and streamed as OpenAI deltas
 * (gateway/tool_stream.c), without a server.
 *
 * Parsing: Hermes <tool_call> blocks, Llama 3.1 {"name", "parameters"}
 * bare or after <|python_tag|> (';'-separated parallel calls), Mistral
 * [TOOL_CALLS] lists, and the bare object of a forced call; malformed
 * calls (unknown name, arguments not an object, broken JSON, a block cut
 * short, trailing text after a bare object) are no call at all.
 *
 * Streaming: every answer is fed to the streamer in pieces (byte by byte,
 * and in chunks of several sizes); the content deltas must equal the text
 * before the marker (all of it when there is none, with the finish's
 * rest), and each call's argument fragments, joined, must be the raw text
 * of its arguments object, valid JSON equal to what the whole-answer parse
 * gives, with one head per call, indexes 0, 1, ... */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gateway_impl.h"

static gw_tools *tools_of(const char *a, const char *b) {
    gw_tools *t = calloc(1, sizeof *t);
    assert_non_null(t);
    t->mode = GW_TOOLS_AUTO;
    t->names[t->n++] = strdup(a);
    if (b) t->names[t->n++] = strdup(b);
    return t;
}

/* The parse of text as "name(args);name(args)" (args compact), or NULL. */
static char *parsed(const gw_tools *t, const char *text, size_t *content_len) {
    cJSON *calls = gw_tool_parse(t, text, strlen(text), content_len);
    if (!calls) return NULL;
    char *out = calloc(1, 4096);
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        char *a = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "arguments"));
        snprintf(out + strlen(out), 4096 - strlen(out), "%s%s(%s)", out[0] ? ";" : "",
                 cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring, a);
        free(a);
    }
    cJSON_Delete(calls);
    return out;
}

static void expect_calls(const gw_tools *t, const char *text, const char *want, size_t want_content) {
    size_t content_len = 12345;
    char *got = parsed(t, text, &content_len);
    if (!want) {
        if (got) fail_msg("%s: parsed as %s, expected no call", text, got);
        assert_int_equal(content_len, strlen(text));
        return;
    }
    if (!got) fail_msg("%s: no call, expected %s", text, want);
    if (strcmp(got, want) != 0) fail_msg("%s: %s, expected %s", text, got, want);
    assert_int_equal(content_len, want_content);
    free(got);
}

static void test_parse_formats(void **state) {
    (void)state;
    gw_tools *t = tools_of("get_weather", "now");
    /* Hermes / Qwen */
    expect_calls(t, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                 "get_weather({\"city\":\"Paris\"})", 0);
    expect_calls(t,
                 "Checking.<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": "
                 "\"get_weather\", \"arguments\": {\"city\": \"Rome\"}}</tool_call>",
                 "now({});get_weather({\"city\":\"Rome\"})", 9);
    /* Llama 3.1: bare, parameters; after <|python_tag|>; parallel with ';' */
    expect_calls(t, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": [1, 2]}}",
                 "get_weather({\"city\":\"Oslo\",\"days\":[1,2]})", 0);
    expect_calls(t, "  \n{\"name\": \"now\", \"parameters\": {}}\n", "now({})", 0);
    expect_calls(t,
                 "<|python_tag|>{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": "
                 "{\"city\": \"Lima\"}}",
                 "now({});get_weather({\"city\":\"Lima\"})", 0);
    expect_calls(t, "Let me look.<|python_tag|>{\"name\": \"now\", \"parameters\": {}}<|eom_id|>", "now({})", 12);
    /* Mistral: a list (parallel), one object */
    expect_calls(t,
                 "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}, {\"name\": \"now\", "
                 "\"arguments\": {}}]",
                 "get_weather({\"city\":\"Bern\"});now({})", 0);
    expect_calls(t, "[TOOL_CALLS]{\"name\": \"now\", \"arguments\": {}}", "now({})", 0);
    /* not calls: delivered as content */
    expect_calls(t, "It is sunny in Paris.", NULL, 0);
    expect_calls(t, "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>", NULL, 0);     /* unknown */
    expect_calls(t, "<tool_call>{\"name\": \"now\", \"arguments\": \"x\"}</tool_call>", NULL, 0); /* not an object */
    expect_calls(t, "<tool_call>{\"name\": \"now\", \"arguments\": {}</tool_call>", NULL, 0);     /* broken JSON */
    expect_calls(t, "<tool_call>{\"name\": \"now\", \"arguments\": {}}", NULL, 0);                /* cut short */
    expect_calls(t,
                 "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"now\"}"
                 "</tool_call>",
                 NULL, 0);                                                                     /* one bad: none */
    expect_calls(t, "{\"name\": \"now\", \"parameters\": {}} is what I would call.", NULL, 0); /* bare + text */
    expect_calls(t, "{\"a\": 1}", NULL, 0);
    expect_calls(t, "[TOOL_CALLS] []", NULL, 0);
    expect_calls(t, "[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}}, 3]", NULL, 0);
    expect_calls(t, "<|python_tag|>print(1)", NULL, 0);
    gw_tools_free(&t);
}

/* What a stream of text delivered: the content and each call's name and arguments. */
typedef struct streamed {
    char content[4096];
    int n_calls;
    char name[8][64];
    char args[8][2048];
} streamed;

/* Feeds text to a fresh streamer in pieces of step bytes (0: growing sizes 1, 2, 3, ...). */
static void stream(const gw_tools *tools, const char *text, size_t step, streamed *out) {
    memset(out, 0, sizeof *out);
    gw_tool_stream t;
    memset(&t, 0, sizeof t);
    size_t len = strlen(text), at = 0, sent = 0, k = 1;
    while (at < len) {
        at += step ? step : k++;
        if (at > len) at = len;
        gw_tool_delta d;
        while (gw_tool_stream_next(&t, tools, text, at, &d)) {
            assert_true(d.index >= 0 && d.index < 8);
            if (d.head) {
                assert_int_equal(d.index, out->n_calls); /* one head per call, in order */
                out->n_calls++;
                snprintf(out->name[d.index], sizeof out->name[0], "%.*s", (int)d.name_len, text + d.name_from);
            } else {
                assert_int_equal(d.index, out->n_calls - 1);
                assert_true(d.args_len > 0);
            }
            strncat(out->args[d.index], text + d.args_from, d.args_len);
        }
        assert_true(t.content_end >= sent && t.content_end <= at);
        strncat(out->content, text + sent, t.content_end - sent);
        sent = t.content_end;
    }
    if (out->n_calls == 0) strcat(out->content, text + sent); /* the finish delivers what was held back */
}

/* Streams text in several piece sizes; the content is want_content, and
 * the calls reassemble into what the whole-answer parse finds. */
static void expect_stream(const gw_tools *tools, const char *text, const char *want_content) {
    size_t content_len;
    cJSON *calls = gw_tool_parse(tools, text, strlen(text), &content_len);
    static const size_t steps[] = {1, 2, 3, 7, 1000, 0};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        streamed got;
        stream(tools, text, steps[s], &got);
        if (strcmp(got.content, want_content) != 0)
            fail_msg("step %zu: %s: content '%s', expected '%s'", steps[s], text, got.content, want_content);
        assert_int_equal(got.n_calls, calls ? cJSON_GetArraySize(calls) : 0);
        for (int k = 0; k < got.n_calls; k++) {
            const cJSON *want = cJSON_GetArrayItem(calls, k);
            assert_string_equal(got.name[k], cJSON_GetObjectItemCaseSensitive(want, "name")->valuestring);
            cJSON *args = cJSON_Parse(got.args[k]); /* reassembled: valid JSON, the parse's arguments */
            if (!args) fail_msg("step %zu: call %d: arguments '%s' are not JSON", steps[s], k, got.args[k]);
            assert_true(cJSON_Compare(args, cJSON_GetObjectItemCaseSensitive(want, "arguments"), true));
            cJSON_Delete(args);
        }
    }
    cJSON_Delete(calls);
}

static void test_stream_formats(void **state) {
    (void)state;
    gw_tools *t = tools_of("get_weather", "now");
    expect_stream(t, "The weather is {fine} today; <tool_ and that is all.",
                  "The weather is {fine} today; <tool_ and that is all.");
    expect_stream(t,
                  "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par\\\"is}\", "
                  "\"units\": {\"t\": \"C\"}}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": "
                  "{}}\n</tool_call>",
                  "Sure.\n");
    expect_stream(t, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": [1, {\"x\": 2}]}}",
                  "");
    expect_stream(t, "{\"arguments\": {\"city\": \"Oslo\"}, \"name\": \"get_weather\"}", ""); /* name last */
    expect_stream(t,
                  "<|python_tag|>{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"get_weather\", "
                  "\"parameters\": {\"city\": \"Lima\"}}",
                  "");
    expect_stream(t,
                  "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}, {\"name\": "
                  "\"now\", \"arguments\": {}}]",
                  "");
    expect_stream(t, "Let me see: [TOOL_CALLS][{\"name\": \"now\", \"arguments\": {\"tz\": \"UTC\"}}]", "Let me see: ");
    gw_tools_free(&t);
}

/* A call naming no function of the request: nothing streams after the
 * marker, and the finish finds no call. */
static void test_stream_unknown(void **state) {
    (void)state;
    gw_tools *t = tools_of("now", NULL);
    streamed got;
    stream(t, "Hi <tool_call>{\"name\": \"rm\", \"arguments\": {\"path\": \"/\"}}</tool_call>", 1, &got);
    assert_int_equal(got.n_calls, 0);
    gw_tools_free(&t);
}

/* The finish delta of a job: calls not streamed yet go out whole, held text as content. */
static void test_finish_delta(void **state) {
    (void)state;
    gw_job job;
    memset(&job, 0, sizeof job);
    snprintf(job.id, sizeof job.id, "chatcmpl-xyz");
    job.endpoint = GW_EP_CHAT;
    job.tools = tools_of("get_weather", "now");
    job.n_choices = 1;
    gw_choice *c = &job.choices[0];
    char text[] = "[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": "
                  "{\"city\": \"Bern\"}}]";
    c->text = text;
    c->text_len = strlen(text);
    c->ts.n_heads = 1; /* the first call was streamed */
    cJSON *d = cJSON_CreateObject();
    const char *finish = "stop";
    gw_tool_finish_delta(&job, 0, d, &finish);
    assert_string_equal(finish, "tool_calls");
    char id[16], want[256];
    gw_tool_call_id(&job, 0, 1, id, sizeof id); /* the second call's id (test_gateway_parse checks its form) */
    snprintf(want, sizeof want,
             "{\"tool_calls\":[{\"index\":1,\"id\":\"%s\",\"type\":\"function\",\"function\":"
             "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Bern\\\"}\"}}]}",
             id);
    char *s = cJSON_PrintUnformatted(d);
    assert_string_equal(s, want);
    free(s);
    cJSON_Delete(d);
    /* no call: the text not streamed yet, as content */
    char plain[] = "No tool needed: <tool";
    c->text = plain;
    c->text_len = strlen(plain);
    c->streamed = 16;
    c->ts.n_heads = 0;
    d = cJSON_CreateObject();
    finish = "stop";
    gw_tool_finish_delta(&job, 0, d, &finish);
    assert_string_equal(finish, "stop");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(d, "content")->valuestring, "<tool");
    cJSON_Delete(d);
    gw_tools_free(&job.tools);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_formats),
        cmocka_unit_test(test_stream_formats),
        cmocka_unit_test(test_stream_unknown),
        cmocka_unit_test(test_finish_delta),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_gateway_parse.c — the gateway's OpenAI request parsing and response
 * building (gateway/openai.c) without a server: defaults, every field's
 * type and range checks with the param they name, chat message shapes,
 * prompt forms, UTF-8 validation, the constant-time key comparison, the
 * per-choice seeds, and the JSON of responses, chunks and errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gateway_impl.h"

static bool parse(gw_endpoint ep, const char *body, gw_gen *g, gw_error *err) {
    memset(err, 0, sizeof *err);
    return gw_gen_parse(ep, body, strlen(body), g, err);
}

/* Expects body to be refused with status and param ("" = null). */
static void refused(gw_endpoint ep, const char *body, int status, const char *param) {
    gw_gen g;
    gw_error err;
    if (parse(ep, body, &g, &err)) {
        gw_gen_clear(&g);
        fail_msg("accepted: %s", body);
    }
    if (err.http_status != status || strcmp(err.param, param) != 0)
        fail_msg("%s: status %d param '%s' (%s), expected %d '%s'", body, err.http_status, err.param, err.message,
                 status, param);
    assert_true(err.message[0] != '\0');
}

static void test_chat_defaults(void **state) {
    (void)state;
    gw_gen g;
    gw_error err;
    assert_true(parse(GW_EP_CHAT,
                      "{\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                      "\"unknown_field\":{\"a\":[1]}}",
                      &g, &err));
    assert_int_equal(g.n_prompts, 1);
    assert_int_equal(g.prompts[0].n_turns, 1);
    assert_string_equal(g.prompts[0].turns[0].role, "user");
    assert_string_equal(g.prompts[0].turns[0].content, "hi");
    assert_int_equal(g.n, 1);
    assert_int_equal(g.max_tokens, 0);
    assert_true(g.sampling.temperature == 1.0f && g.sampling.top_p == 1.0f && g.sampling.top_k == 0);
    assert_int_equal(g.sampling.rule, SD_RULE_DEFAULT); /* no verify_rule: the service's */
    assert_false(g.stream || g.seeded || g.include_usage);
    gw_gen_clear(&g);
}

/* The neutral values of the output-changing fields specd does not honour
 * are accepted (clients send them by default). */
static void test_neutral_fields(void **state) {
    (void)state;
    gw_gen g;
    gw_error err;
    assert_true(parse(GW_EP_CHAT,
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                      "\"response_format\":{\"type\":\"text\"},\"tools\":[],\"tool_choice\":\"none\","
                      "\"functions\":null,\"function_call\":\"none\",\"modalities\":[\"text\"],"
                      "\"parallel_tool_calls\":true}",
                      &g, &err));
    gw_gen_clear(&g);
    assert_true(parse(GW_EP_COMPLETIONS, "{\"prompt\":\"p\",\"best_of\":1,\"suffix\":\"\"}", &g, &err));
    gw_gen_clear(&g);
}

static void test_fields(void **state) {
    (void)state;
    gw_gen g;
    gw_error err;
    assert_true(parse(GW_EP_COMPLETIONS,
                      "{\"prompt\":\"p\",\"max_completion_tokens\":7,\"temperature\":0,\"top_p\":0.5,\"top_k\":-1,"
                      "\"min_p\":0.1,\"seed\":-1,\"n\":3,\"stop\":[\"a\",\"bc\"],\"stream\":true,"
                      "\"stream_options\":{\"include_usage\":true},\"ignore_eos\":true,\"presence_penalty\":0,"
                      "\"logprobs\":null,\"echo\":false,\"verify_rule\":\"rejection\"}",
                      &g, &err));
    assert_int_equal(g.max_tokens, 7);
    assert_int_equal(g.sampling.rule, SD_RULE_REJECTION);
    assert_true(g.sampling.temperature == 0.0f && g.sampling.top_p == 0.5f && g.sampling.top_k == 0);
    assert_true(fabsf(g.sampling.min_p - 0.1f) < 1e-7f);
    assert_true(g.seeded);
    assert_true(g.sampling.seed == UINT64_MAX); /* -1 as two's complement */
    assert_int_equal(g.n, 3);
    assert_int_equal(g.n_stop, 2);
    assert_string_equal(g.stop[1], "bc");
    assert_true(g.stream && g.include_usage && g.ignore_eos);
    gw_gen_clear(&g);
    /* completions default to 16 tokens, as OpenAI */
    assert_true(parse(GW_EP_COMPLETIONS, "{\"prompt\":\"p\",\"stop\":\"x\"}", &g, &err));
    assert_int_equal(g.max_tokens, 16);
    assert_int_equal(g.n_stop, 1);
    gw_gen_clear(&g);
}

static void test_bad_fields(void **state) {
    (void)state;
    const gw_endpoint C = GW_EP_COMPLETIONS;
    refused(C, "{\"prompt\":", 400, "");
    refused(C, "[]", 400, "");
    refused(C, "{}", 400, "prompt");
    refused(C, "{\"prompt\":\"\"}", 400, "prompt");
    refused(C, "{\"prompt\":[]}", 400, "prompt");
    refused(C, "{\"prompt\":[1,-2]}", 400, "prompt");
    refused(C, "{\"prompt\":[1.5]}", 400, "prompt");
    refused(C, "{\"prompt\":[\"a\",7]}", 400, "prompt[1]");
    refused(C, "{\"prompt\":\"p\",\"model\":5}", 400, "model");
    refused(C, "{\"prompt\":\"p\",\"max_tokens\":0}", 400, "max_tokens");
    refused(C, "{\"prompt\":\"p\",\"max_tokens\":-1}", 400, "max_tokens");
    refused(C, "{\"prompt\":\"p\",\"max_tokens\":\"3\"}", 400, "max_tokens");
    refused(C, "{\"prompt\":\"p\",\"max_completion_tokens\":1.5}", 400, "max_completion_tokens");
    refused(C, "{\"prompt\":\"p\",\"temperature\":2.5}", 400, "temperature");
    refused(C, "{\"prompt\":\"p\",\"temperature\":-0.1}", 400, "temperature");
    refused(C, "{\"prompt\":\"p\",\"temperature\":1e999}", 400, "temperature");
    refused(C, "{\"prompt\":\"p\",\"top_p\":0}", 400, "top_p");
    refused(C, "{\"prompt\":\"p\",\"top_p\":1.01}", 400, "top_p");
    refused(C, "{\"prompt\":\"p\",\"top_k\":-2}", 400, "top_k");
    refused(C, "{\"prompt\":\"p\",\"min_p\":1}", 400, "min_p");
    refused(C, "{\"prompt\":\"p\",\"verify_rule\":\"greedy\"}", 400, "verify_rule");
    refused(C, "{\"prompt\":\"p\",\"verify_rule\":2}", 400, "verify_rule");
    refused(C, "{\"prompt\":\"p\",\"seed\":1.5}", 400, "seed");
    refused(C, "{\"prompt\":\"p\",\"n\":17}", 400, "n");
    refused(C, "{\"prompt\":[\"a\",\"b\"],\"n\":9}", 400, "n");
    refused(C, "{\"prompt\":\"p\",\"stop\":[\"\"]}", 400, "stop");
    refused(C, "{\"prompt\":\"p\",\"stop\":[1]}", 400, "stop");
    refused(C, "{\"prompt\":\"p\",\"stream\":1}", 400, "stream");
    refused(C, "{\"prompt\":\"p\",\"stream_options\":[]}", 400, "stream_options");
    refused(C, "{\"prompt\":\"p\",\"stream_options\":{\"include_usage\":\"yes\"}}", 400,
            "stream_options.include_usage");
    refused(C, "{\"prompt\":\"p\",\"frequency_penalty\":2.5}", 400, "frequency_penalty");
    refused(C, "{\"prompt\":\"p\",\"presence_penalty\":-2.01}", 400, "presence_penalty");
    refused(C, "{\"prompt\":\"p\",\"presence_penalty\":\"1\"}", 400, "presence_penalty");
    refused(C, "{\"prompt\":\"p\",\"logprobs\":21}", 400, "logprobs");
    refused(C, "{\"prompt\":\"p\",\"logprobs\":-1}", 400, "logprobs");
    refused(C, "{\"prompt\":\"p\",\"logprobs\":true}", 400, "logprobs"); /* completions: a count */
    refused(C, "{\"prompt\":\"p\",\"echo\":1}", 400, "echo");
    refused(C, "{\"prompt\":\"p\",\"max_tokens\":0}", 400, "max_tokens"); /* generates nothing: needs echo */
    refused(C, "{\"prompt\":\"p\",\"max_completion_tokens\":0,\"echo\":false}", 400, "max_completion_tokens");
    refused(C, "{\"prompt\":\"p\",\"max_tokens\":-1,\"echo\":true}", 400, "max_tokens");
    refused(C, "{\"prompt\":\"p\",\"logit_bias\":{\"1\":5}}", 400, "logit_bias");
    /* Fields that change the output and are not honoured: a 400 naming each. */
    refused(C, "{\"prompt\":\"p\",\"response_format\":\"text\"}", 400, "response_format");
    refused(C, "{\"prompt\":\"p\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}", 400, "tools");
    refused(C, "{\"prompt\":\"p\",\"tool_choice\":\"required\"}", 400, "tool_choice");
    refused(C, "{\"prompt\":\"p\",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}", 400,
            "tool_choice");
    refused(C, "{\"prompt\":\"p\",\"functions\":[{\"name\":\"f\"}]}", 400, "functions");
    refused(C, "{\"prompt\":\"p\",\"function_call\":\"auto\"}", 400, "function_call");
    refused(C, "{\"prompt\":\"p\",\"best_of\":2}", 400, "best_of");
    refused(C, "{\"prompt\":\"p\",\"suffix\":\"end\"}", 400, "suffix");
    refused(C, "{\"prompt\":\"p\",\"modalities\":[\"text\",\"audio\"]}", 400, "modalities");
    refused(C, "{\"prompt\":\"p\",\"audio\":{\"voice\":\"alloy\"}}", 400, "audio");
    refused(C, "{\"prompt\":\"p\",\"reasoning_effort\":\"low\"}", 400, "reasoning_effort");
    refused(C, "{\"prompt\":\"p\",\"web_search_options\":{}}", 400, "web_search_options");
    refused(C, "{\"prompt\":\"p\",\"guided_whitespace_pattern\":\" *\"}", 400, "guided_whitespace_pattern");
    refused(GW_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[{}]}", 400, "tools[0]");
    refused(GW_EP_CHAT,
            "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"x\"}]},"
            "{\"role\":\"user\",\"content\":\"q\"}]}",
            400, "messages[0].tool_calls");
    /* 17 stop strings */
    char body[512] = "{\"prompt\":\"p\",\"stop\":[";
    for (int i = 0; i < 17; i++) strcat(body, i ? ",\"s\"" : "\"s\"");
    strcat(body, "]}");
    refused(C, body, 400, "stop");
}

/* response_format and llama.cpp's grammar / json_schema become the
 * request's constraint; a malformed one is a 400 naming the field. */
static void test_response_format(void **state) {
    (void)state;
    gw_gen g;
    gw_error err;
    assert_true(parse(GW_EP_CHAT,
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                      "\"response_format\":{\"type\":\"json_object\"}}",
                      &g, &err));
    assert_int_equal(g.constraint_kind, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_OBJECT);
    assert_null(g.constraint_text);
    gw_gen_clear(&g);
    assert_true(parse(GW_EP_COMPLETIONS,
                      "{\"prompt\":\"p\",\"stream\":true,\"response_format\":{\"type\":\"json_schema\","
                      "\"json_schema\":{\"name\":\"person\",\"strict\":true,\"schema\":"
                      "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}}",
                      &g, &err));
    assert_int_equal(g.constraint_kind, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA);
    assert_string_equal(g.constraint_text, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}");
    gw_gen_clear(&g);
    assert_true(parse(GW_EP_COMPLETIONS, "{\"prompt\":\"p\",\"grammar\":\"root ::= \\\"a\\\"\"}", &g, &err));
    assert_int_equal(g.constraint_kind, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_GRAMMAR);
    assert_string_equal(g.constraint_text, "root ::= \"a\"");
    gw_gen_clear(&g);
    assert_true(parse(GW_EP_COMPLETIONS, "{\"prompt\":\"p\",\"json_schema\":{\"type\":\"string\"}}", &g, &err));
    assert_int_equal(g.constraint_kind, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA);
    gw_gen_clear(&g);
    assert_true(parse(GW_EP_COMPLETIONS, "{\"prompt\":\"p\",\"response_format\":{\"type\":\"text\"}}", &g, &err));
    assert_int_equal(g.constraint_kind, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE);
    gw_gen_clear(&g);
    const gw_endpoint C = GW_EP_COMPLETIONS;
    refused(C, "{\"prompt\":\"p\",\"response_format\":{}}", 400, "response_format.type");
    refused(C, "{\"prompt\":\"p\",\"response_format\":{\"type\":\"xml\"}}", 400, "response_format.type");
    refused(C, "{\"prompt\":\"p\",\"response_format\":{\"type\":\"json_schema\"}}", 400,
            "response_format.json_schema");
    refused(C, "{\"prompt\":\"p\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}}", 400,
            "response_format.json_schema.name");
    refused(C,
            "{\"prompt\":\"p\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}}",
            400, "response_format.json_schema.schema");
    refused(C,
            "{\"prompt\":\"p\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
            "\"schema\":{},\"strict\":1}}}",
            400, "response_format.json_schema.strict");
    refused(C,
            "{\"prompt\":\"p\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
            "\"schema\":[1]}}}",
            400, "response_format.json_schema.schema");
    refused(C, "{\"prompt\":\"p\",\"response_format\":{\"type\":\"json_object\"},\"grammar\":\"root ::= \\\"a\\\"\"}",
            400, "response_format");
    refused(C, "{\"prompt\":\"p\",\"grammar\":\"\"}", 400, "grammar");
    refused(C, "{\"prompt\":\"p\",\"json_schema\":\"{}\"}", 400, "json_schema");
    refused(C, "{\"prompt\":\"p\",\"ignore_eos\":true,\"response_format\":{\"type\":\"json_object\"}}", 400,
            "ignore_eos");
}

/* vLLM's guided_* fields: each onto its constraint kind, guided_choice as
 * a GBNF alternation with its strings escaped; one at a time, and none with
 * response_format / grammar / json_schema. */
static void test_guided(void **state) {
    (void)state;
    gw_gen g;
    gw_error err;
    const gw_endpoint C = GW_EP_COMPLETIONS;
    assert_true(parse(C, "{\"prompt\":\"p\",\"guided_json\":{\"type\": \"object\"}}", &g, &err));
    assert_int_equal(g.constraint_kind, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA);
    assert_string_equal(g.constraint_text, "{\"type\":\"object\"}");
    gw_gen_clear(&g);
    assert_true(parse(C, "{\"prompt\":\"p\",\"guided_json\":\"{\\\"type\\\": \\\"string\\\"}\"}", &g, &err));
    assert_int_equal(g.constraint_kind, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA);
    assert_string_equal(g.constraint_text, "{\"type\":\"string\"}");
    gw_gen_clear(&g);
    assert_true(parse(C, "{\"prompt\":\"p\",\"guided_regex\":\"[0-9]+\"}", &g, &err));
    assert_int_equal(g.constraint_kind, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_REGEX);
    assert_string_equal(g.constraint_text, "[0-9]+");
    gw_gen_clear(&g);
    assert_true(parse(
        C, "{\"prompt\":\"p\",\"guided_grammar\":\"root ::= \\\"x\\\"\",\"guided_decoding_backend\":\"x\"}", &g, &err));
    assert_int_equal(g.constraint_kind, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_GRAMMAR);
    assert_string_equal(g.constraint_text, "root ::= \"x\"");
    gw_gen_clear(&g);
    assert_true(parse(C, "{\"prompt\":\"p\",\"guided_choice\":[\"yes\",\"a \\\"q\\\" \\\\ b\\n\",\"été\"]}", &g, &err));
    assert_int_equal(g.constraint_kind, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_GRAMMAR);
    assert_string_equal(g.constraint_text, "root ::= \"yes\" | \"a \\\"q\\\" \\\\ b\\x0A\" | \"été\"");
    gw_gen_clear(&g);
    refused(C, "{\"prompt\":\"p\",\"guided_choice\":[]}", 400, "guided_choice");
    refused(C, "{\"prompt\":\"p\",\"guided_choice\":[\"a\",\"\"]}", 400, "guided_choice");
    refused(C, "{\"prompt\":\"p\",\"guided_choice\":\"a\"}", 400, "guided_choice");
    refused(C, "{\"prompt\":\"p\",\"guided_json\":[1]}", 400, "guided_json");
    refused(C, "{\"prompt\":\"p\",\"guided_json\":\"{not json\"}", 400, "guided_json");
    refused(C, "{\"prompt\":\"p\",\"guided_regex\":\"\"}", 400, "guided_regex");
    refused(C, "{\"prompt\":\"p\",\"guided_regex\":\"a\",\"guided_choice\":[\"a\"]}", 400, "guided_choice");
    refused(C, "{\"prompt\":\"p\",\"guided_regex\":\"a\",\"response_format\":{\"type\":\"json_object\"}}", 400,
            "guided_regex");
    refused(C, "{\"prompt\":\"p\",\"guided_json\":{},\"grammar\":\"root ::= \\\"a\\\"\"}", 400, "guided_json");
    /* response_format text is no constraint: guided_regex goes with it */
    assert_true(
        parse(C, "{\"prompt\":\"p\",\"guided_regex\":\"a\",\"response_format\":{\"type\":\"text\"}}", &g, &err));
    assert_int_equal(g.constraint_kind, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_REGEX);
    gw_gen_clear(&g);
}

/* tools: passed to the chat template as JSON; required / named forced by a
 * JSON Schema constraint; tool turns and assistant tool_calls passed as
 * such; answers parsed back into tool_calls. */
static void test_tools(void **state) {
    (void)state;
    gw_gen g;
    gw_error err;
    const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
                        "\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";
    char body[2048];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],%s}", tools);
    assert_true(parse(GW_EP_CHAT, body, &g, &err));
    assert_int_equal(g.tools->mode, GW_TOOLS_AUTO); /* the default with tools */
    assert_int_equal(g.tools->n, 2);
    assert_int_equal(g.prompts[0].n_turns, 1); /* the template renders them (on the coordinator) */
    assert_non_null(g.tools_json);
    assert_memory_equal(g.tools_json, "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"", 44);
    assert_int_equal(g.constraint_kind, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_NONE);
    gw_gen_clear(&g);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"q\"}],%s,"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}",
             tools);
    assert_true(parse(GW_EP_CHAT, body, &g, &err));
    assert_int_equal(g.tools->mode, GW_TOOLS_NAMED);
    assert_int_equal(g.prompts[0].n_turns, 2);
    assert_string_equal(g.prompts[0].turns[0].content, "S");
    assert_int_equal(g.constraint_kind, SPECD__CONSTRAINT_KIND__CONSTRAINT_KIND_JSON_SCHEMA);
    /* the call's arguments under "arguments" or "parameters" (Llama 3.1's key) */
    assert_non_null(strstr(g.constraint_text, "{\"const\":\"get_weather\"},\"arguments\":{"));
    assert_non_null(strstr(g.constraint_text, "{\"const\":\"get_weather\"},\"parameters\":{"));
    assert_null(strstr(g.constraint_text, "\"now\""));
    gw_gen_clear(&g);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],%s,\"tool_choice\":\"required\"}", tools);
    assert_true(parse(GW_EP_CHAT, body, &g, &err));
    assert_non_null(strstr(g.constraint_text, "\"anyOf\":[{"));
    assert_non_null(strstr(g.constraint_text, "{\"const\":\"now\"}"));
    /* an answer of the forced kind parses into one call */
    gw_job job;
    memset(&job, 0, sizeof job);
    snprintf(job.id, sizeof job.id, "chatcmpl-abc");
    job.tools = g.tools;
    job.n_choices = 1;
    char answer[] = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";
    job.choices[0].text = answer;
    job.choices[0].text_len = strlen(answer);
    cJSON *calls = gw_tool_calls(&job, 0);
    assert_non_null(calls);
    assert_int_equal(cJSON_GetArraySize(calls), 1);
    /* the id: 9 letters and digits (Mistral's template demands them), one per job, choice and call */
    const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, 0), "id"));
    assert_non_null(id);
    assert_int_equal(strlen(id), 9);
    assert_int_equal(strspn(id, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"), 9);
    char want[256], other[16];
    gw_tool_call_id(&job, 0, 1, other, sizeof other);
    assert_string_not_equal(id, other);
    gw_tool_call_id(&job, 1, 0, other, sizeof other);
    assert_string_not_equal(id, other);
    snprintf(want, sizeof want,
             "[{\"index\":0,\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":"
             "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]",
             id);
    char *s = cJSON_PrintUnformatted(calls);
    assert_string_equal(s, want);
    free(s);
    cJSON_Delete(calls);
    /* auto: <tool_call> blocks (two: parallel calls); an unknown name or text is no call */
    char two[] = "Sure.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
                 "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
    job.choices[0].text = two;
    job.choices[0].text_len = strlen(two);
    assert_non_null(calls = gw_tool_calls(&job, 0));
    assert_int_equal(cJSON_GetArraySize(calls), 2);
    cJSON_Delete(calls);
    char unknown[] = "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>", plain[] = "It is sunny.";
    job.choices[0].text = unknown;
    job.choices[0].text_len = strlen(unknown);
    assert_null(gw_tool_calls(&job, 0));
    job.choices[0].text = plain;
    job.choices[0].text_len = strlen(plain);
    assert_null(gw_tool_calls(&job, 0));
    gw_gen_clear(&g);
    /* history: tool_calls and a tool answer go to the chat template as such */
    assert_true(
        parse(GW_EP_CHAT,
              "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":null,"
              "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":"
              "\"{\\\"tz\\\": 1.0}\"}},{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"x\"}}]},"
              "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"12:00\"}],"
              "\"tool_choice\":\"none\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]}",
              &g, &err));
    assert_null(g.tools); /* tool_choice none: plain text, tools not described */
    assert_int_equal(g.prompts[0].n_turns, 3);
    assert_string_equal(g.prompts[0].turns[1].content, "");
    /* the arguments' own text (1.0 stays 1.0), or the string when it is not JSON */
    assert_string_equal(g.prompts[0].turns[1].tool_calls,
                        "[{\"name\":\"now\",\"arguments\":{\"tz\": 1.0},\"id\":\"c1\"},{\"name\":\"now\",\"arguments\":"
                        "\"x\"}]");
    assert_null(g.prompts[0].turns[1].tool_call_id);
    assert_string_equal(g.prompts[0].turns[2].role, "tool");
    assert_string_equal(g.prompts[0].turns[2].content, "12:00");
    assert_null(g.prompts[0].turns[2].tool_calls);
    assert_string_equal(g.prompts[0].turns[2].tool_call_id, "c1"); /* carried for Mistral's template */
    gw_gen_clear(&g);
    /* refusals */
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],%s,\"tool_choice\":{\"type\":\"function\","
             "\"function\":{\"name\":\"nope\"}}}",
             tools);
    refused(GW_EP_CHAT, body, 400, "tool_choice");
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],%s,\"tool_choice\":\"always\"}",
             tools);
    refused(GW_EP_CHAT, body, 400, "tool_choice");
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],%s,\"response_format\":{\"type\":\"json_object\"}}",
             tools);
    refused(GW_EP_CHAT, body, 400, "response_format");
    refused(GW_EP_CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[{\"type\":\"function\",\"function\":"
            "{\"name\":\"a b\"}}]}",
            400, "tools[0]");
    /* a tool turn's tool_call_id: a string of 1 to SD_MAX_CALL_ID_BYTES bytes */
    refused(GW_EP_CHAT, "{\"messages\":[{\"role\":\"tool\",\"tool_call_id\":7,\"content\":\"x\"}]}", 400,
            "messages[0].tool_call_id");
    refused(GW_EP_CHAT, "{\"messages\":[{\"role\":\"tool\",\"tool_call_id\":\"\",\"content\":\"x\"}]}", 400,
            "messages[0].tool_call_id");
    char long_id[SD_MAX_CALL_ID_BYTES + 2];
    memset(long_id, 'a', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"tool\",\"tool_call_id\":\"%s\",\"content\":\"x\"}]}",
             long_id);
    refused(GW_EP_CHAT, body, 400, "messages[0].tool_call_id");
    /* a call's id that is not a string */
    refused(GW_EP_CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":"
            "1,\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
            "\"content\":\"x\"}]}",
            400, "messages[1].tool_calls");
}

static void test_messages(void **state) {
    (void)state;
    const gw_endpoint H = GW_EP_CHAT;
    gw_gen g;
    gw_error err;
    assert_true(parse(H,
                      "{\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                      "{\"type\":\"text\",\"text\":\"b\"}]}]}",
                      &g, &err));
    assert_int_equal(g.prompts[0].n_turns, 2);
    assert_string_equal(g.prompts[0].turns[0].role, "system");
    assert_string_equal(g.prompts[0].turns[0].content, "be brief");
    assert_string_equal(g.prompts[0].turns[1].role, "user");
    assert_string_equal(g.prompts[0].turns[1].content, "ab");
    assert_null(g.prompts[0].text);
    gw_gen_clear(&g);
    /* a history goes through whole, in order; the template judges the order */
    assert_true(parse(H,
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"},"
                      "{\"role\":\"user\",\"content\":\"\"}]}",
                      &g, &err));
    assert_int_equal(g.prompts[0].n_turns, 3);
    assert_string_equal(g.prompts[0].turns[1].role, "assistant");
    assert_string_equal(g.prompts[0].turns[1].content, "b");
    assert_string_equal(g.prompts[0].turns[2].content, "");
    gw_gen_clear(&g);
    refused(H, "{\"messages\":{}}", 400, "messages");
    refused(H, "{\"messages\":[]}", 400, "messages");
    refused(H, "{}", 400, "messages");
    refused(H, "{\"messages\":[5]}", 400, "messages[0]");
    refused(H, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role");
    refused(H, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages[0].role");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":7}]}", 400, "messages[0].content");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
            "messages[0].content");
    refused(H, "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"}]}", 400, "messages");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"}]}", 400,
            "messages");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"function\",\"content\":\"b\"}]}",
            400, "messages[1].role");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":null}]}", 400,
            "messages[1].content");
    /* more turns than the wire allows */
    size_t cap = 32 + (size_t)(SD_MAX_CHAT_MESSAGES + 1) * 32, len = 0;
    char *many = malloc(cap);
    assert_non_null(many);
    len += (size_t)snprintf(many + len, cap - len, "{\"messages\":[");
    for (int i = 0; i <= SD_MAX_CHAT_MESSAGES; i++)
        len += (size_t)snprintf(many + len, cap - len, "%s{\"role\":\"user\",\"content\":\"x\"}", i ? "," : "");
    snprintf(many + len, cap - len, "]}");
    refused(H, many, 400, "messages");
    free(many);
}

static void test_prompts(void **state) {
    (void)state;
    gw_gen g;
    gw_error err;
    assert_true(parse(GW_EP_COMPLETIONS, "{\"prompt\":[5,6,7]}", &g, &err));
    assert_int_equal(g.n_prompts, 1);
    assert_int_equal(g.prompts[0].n_ids, 3);
    assert_int_equal(g.prompts[0].ids[2], 7);
    gw_gen_clear(&g);
    assert_true(parse(GW_EP_COMPLETIONS, "{\"prompt\":[\"a\",[1,2]],\"n\":2}", &g, &err));
    assert_int_equal(g.n_prompts, 2);
    assert_string_equal(g.prompts[0].text, "a");
    assert_int_equal(g.prompts[1].n_ids, 2);
    gw_gen_clear(&g);
}

static void test_utf8(void **state) {
    (void)state;
    const char *good = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";
    assert_true(gw_utf8_valid(good, strlen(good)));
    assert_false(gw_utf8_valid(good, strlen(good) - 1)); /* the last character cut */
    assert_false(gw_utf8_valid("\xff", 1));
    assert_false(gw_utf8_valid("\xc3", 1));             /* truncated */
    assert_false(gw_utf8_valid("\xc0\xaf", 2));         /* overlong */
    assert_false(gw_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    assert_false(gw_utf8_valid("\xf4\x90\x80\x80", 4)); /* above U+10FFFF */
    gw_gen g;
    gw_error err;
    const char bad[] = "{\"prompt\":\"\xfe\"}";
    assert_false(gw_gen_parse(GW_EP_COMPLETIONS, bad, sizeof bad - 1, &g, &err));
    assert_int_equal(err.http_status, 400);
}

static void test_key_and_seed(void **state) {
    (void)state;
    assert_true(gw_key_equal("s3cret", "s3cret"));
    assert_false(gw_key_equal("s3cre", "s3cret"));
    assert_false(gw_key_equal("s3cret2", "s3cret"));
    assert_false(gw_key_equal("", "s3cret"));
    assert_false(gw_key_equal("S3cret", "s3cret"));
    assert_true(gw_choice_seed(42, 0) == 42);
    assert_true(gw_choice_seed(42, 1) == gw_choice_seed(42, 1));
    assert_true(gw_choice_seed(42, 1) != gw_choice_seed(42, 2));
    assert_true(gw_choice_seed(42, 1) != gw_choice_seed(43, 1));
}

#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void test_logprobs_penalties(void **state) {
    (void)state;
    gw_gen g;
    gw_error err;
    assert_true(parse(GW_EP_CHAT,
                      "{" MSGS ",\"logprobs\":true,\"top_logprobs\":5,\"presence_penalty\":0.5,"
                      "\"frequency_penalty\":-2}",
                      &g, &err));
    assert_true(g.logprobs);
    assert_int_equal(g.top_logprobs, 5);
    assert_true(g.sampling.presence_penalty == 0.5f && g.sampling.frequency_penalty == -2.0f);
    gw_gen_clear(&g);
    assert_true(parse(GW_EP_CHAT, "{" MSGS ",\"logprobs\":false}", &g, &err));
    assert_false(g.logprobs);
    gw_gen_clear(&g);
    assert_true(parse(GW_EP_COMPLETIONS, "{\"prompt\":\"p\",\"logprobs\":0}", &g, &err));
    assert_true(g.logprobs);
    assert_int_equal(g.top_logprobs, 0);
    gw_gen_clear(&g);
    assert_true(parse(GW_EP_COMPLETIONS, "{\"prompt\":\"p\",\"logprobs\":20}", &g, &err));
    assert_int_equal(g.top_logprobs, 20);
    gw_gen_clear(&g);
    refused(GW_EP_CHAT, "{" MSGS ",\"top_logprobs\":3}", 400, "top_logprobs");
    refused(GW_EP_CHAT, "{" MSGS ",\"logprobs\":false,\"top_logprobs\":3}", 400, "top_logprobs");
    refused(GW_EP_CHAT, "{" MSGS ",\"logprobs\":true,\"top_logprobs\":21}", 400, "top_logprobs");
    refused(GW_EP_CHAT, "{" MSGS ",\"logprobs\":true,\"top_logprobs\":-1}", 400, "top_logprobs");
    refused(GW_EP_CHAT, "{" MSGS ",\"logprobs\":true,\"top_logprobs\":1.5}", 400, "top_logprobs");
    refused(GW_EP_CHAT, "{" MSGS ",\"logprobs\":1}", 400, "logprobs");
    refused(GW_EP_CHAT, "{" MSGS ",\"frequency_penalty\":3}", 400, "frequency_penalty");
}

/* Both response shapes of logprobs, from one choice with two tokens (one
 * of them not valid UTF-8 on its own) and two alternatives each. */
static void test_logprob_responses(void **state) {
    (void)state;
    gw_job job;
    memset(&job, 0, sizeof job);
    job.endpoint = GW_EP_CHAT;
    job.logprobs = true;
    job.n = 1;
    job.n_choices = 1;
    char bytes[] = "Hi\xe2 yo";
    gw_lp lps[2] = {
        {{7, -0.25f, 0, 2}, 2, {{7, -0.25f, 0, 2}, {9, -2.0f, 3, 3}}},
        {{9, -INFINITY, 2, 1}, 2, {{7, -0.5f, 0, 2}, {9, -1.5f, 3, 3}}},
    };
    job.choices[0] = (gw_choice){
        .text = bytes, .text_len = 3, .n_tokens = 2, .lps = lps, .n_lps = 2, .lp_bytes = bytes, .lp_bytes_len = 6};
    char *s = gw_response_json(&job, "m");
    cJSON *r = cJSON_Parse(s);
    assert_non_null(r);
    const cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs");
    const cJSON *content = cJSON_GetObjectItem(lp, "content");
    assert_int_equal(cJSON_GetArraySize(content), 2);
    const cJSON *e0 = cJSON_GetArrayItem(content, 0), *e1 = cJSON_GetArrayItem(content, 1);
    assert_string_equal(cJSON_GetObjectItem(e0, "token")->valuestring, "Hi");
    assert_true(cJSON_GetObjectItem(e0, "logprob")->valuedouble == -0.25);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(e0, "bytes")), 2);
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(e1, "bytes"), 0)->valueint, 0xe2);
    assert_string_equal(cJSON_GetObjectItem(e1, "token")->valuestring, "\xef\xbf\xbd"); /* U+FFFD */
    assert_true(cJSON_GetObjectItem(e1, "logprob")->valuedouble == -9999.0);            /* -inf */
    const cJSON *top = cJSON_GetObjectItem(e1, "top_logprobs");
    assert_int_equal(cJSON_GetArraySize(top), 2);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(top, 1), "token")->valuestring, " yo");
    cJSON_Delete(r);
    free(s);
    /* streaming: only the tokens asked for */
    s = gw_chunk_json(&job, "m", 0, false, "x", 1, 1, 2, false, false);
    r = cJSON_Parse(s);
    lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(lp, "content")), 1);
    cJSON_Delete(r);
    free(s);
    /* completions: the legacy shape */
    job.endpoint = GW_EP_COMPLETIONS;
    s = gw_response_json(&job, "m");
    r = cJSON_Parse(s);
    assert_non_null(r);
    lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "tokens"), 0)->valuestring, "Hi");
    assert_true(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "token_logprobs"), 1)->valuedouble == -9999.0);
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "text_offset"), 1)->valueint, 2);
    const cJSON *d0 = cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 0);
    assert_true(cJSON_GetObjectItem(d0, "Hi")->valuedouble == -0.25);
    assert_true(cJSON_GetObjectItem(d0, " yo")->valuedouble == -2.0);
    cJSON_Delete(r);
    free(s);
}

/* echo: with logprobs, with a prompt of ids, and max_tokens 0 (the prompt
 * only); chat never takes max_tokens 0. */
static void test_echo(void **state) {
    (void)state;
    const gw_endpoint C = GW_EP_COMPLETIONS;
    gw_gen g;
    gw_error err;
    assert_true(parse(C, "{\"prompt\":\"p\",\"logprobs\":2,\"echo\":true}", &g, &err));
    assert_true(g.echo && g.logprobs && g.top_logprobs == 2 && !g.prompt_only && g.max_tokens == 16);
    gw_gen_clear(&g);
    assert_true(parse(C, "{\"prompt\":[1,2],\"echo\":true,\"max_tokens\":0,\"logprobs\":0}", &g, &err));
    assert_true(g.echo && g.prompt_only && g.max_tokens == 0 && g.logprobs && g.top_logprobs == 0);
    assert_int_equal(g.prompts[0].n_ids, 2);
    gw_gen_clear(&g);
    assert_true(parse(C, "{\"prompt\":[\"a\",[3]],\"echo\":true,\"max_completion_tokens\":0}", &g, &err));
    assert_true(g.prompt_only && g.n_prompts == 2);
    gw_gen_clear(&g);
    refused(GW_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":0}", 400, "max_tokens");
}

/* echo with logprobs in the legacy shape: the prompt's first token has a
 * null logprob and null alternatives (its entry holds NaN); text_offset
 * runs over the prompt's tokens into the generated ones. */
static void test_echo_logprob_responses(void **state) {
    (void)state;
    gw_job job;
    memset(&job, 0, sizeof job);
    job.endpoint = GW_EP_COMPLETIONS;
    job.logprobs = job.echo = true;
    job.n = 1;
    job.n_choices = 1;
    char text[] = "Hi yo!";
    char bytes[] = "Hi yo!";
    gw_lp lps[3] = {
        {{7, NAN, 0, 2}, 0, {{0}}},
        {{9, -1.5f, 2, 3}, 1, {{9, -1.5f, 2, 3}}},
        {{4, -0.5f, 5, 1}, 1, {{4, -0.5f, 5, 1}}},
    };
    job.choices[0] = (gw_choice){.text = text,
                                 .text_len = 6,
                                 .n_tokens = 1,
                                 .prompt_tokens = 2,
                                 .lps = lps,
                                 .n_lps = 3,
                                 .n_prompt_lps = 2,
                                 .lp_bytes = bytes,
                                 .lp_bytes_len = 6,
                                 .stop_reason = SPECD__STOP_REASON__STOP_REASON_LENGTH};
    char *s = gw_response_json(&job, "m");
    cJSON *r = cJSON_Parse(s);
    assert_non_null(r);
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(ch, "text")->valuestring, "Hi yo!");
    const cJSON *lp = cJSON_GetObjectItem(ch, "logprobs");
    const cJSON *v = cJSON_GetObjectItem(lp, "token_logprobs"), *t = cJSON_GetObjectItem(lp, "top_logprobs");
    assert_int_equal(cJSON_GetArraySize(v), 3);
    assert_true(cJSON_IsNull(cJSON_GetArrayItem(v, 0)) && cJSON_IsNull(cJSON_GetArrayItem(t, 0)));
    assert_true(cJSON_GetArrayItem(v, 1)->valuedouble == -1.5 && cJSON_GetArrayItem(v, 2)->valuedouble == -0.5);
    assert_true(cJSON_GetObjectItem(cJSON_GetArrayItem(t, 1), " yo")->valuedouble == -1.5);
    const cJSON *off = cJSON_GetObjectItem(lp, "text_offset");
    assert_true(cJSON_GetArrayItem(off, 0)->valueint == 0 && cJSON_GetArrayItem(off, 1)->valueint == 2 &&
                cJSON_GetArrayItem(off, 2)->valueint == 5);
    assert_string_equal(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "length");
    cJSON_Delete(r);
    free(s);
    /* streamed: the first token's entry alone is still null */
    s = gw_chunk_json(&job, "m", 0, false, "Hi", 2, 0, 1, false, false);
    r = cJSON_Parse(s);
    assert_non_null(r);
    lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs");
    assert_true(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "token_logprobs"), 0)));
    cJSON_Delete(r);
    free(s);
}

static void test_responses(void **state) {
    (void)state;
    gw_job job;
    memset(&job, 0, sizeof job);
    job.endpoint = GW_EP_CHAT;
    snprintf(job.id, sizeof job.id, "chatcmpl-x");
    job.created = 1700000000;
    job.n = 2;
    job.n_choices = 2;
    char t0[] = {'a', '"', 'b', '\n', 1, 0, 'z', 0}; /* an embedded NUL must survive: text_len counts it */
    job.choices[0] = (gw_choice){.index = 0,
                                 .text = t0,
                                 .text_len = 7,
                                 .n_tokens = 3,
                                 .prompt_tokens = 5,
                                 .stop_reason = SPECD__STOP_REASON__STOP_REASON_EOS};
    job.choices[1] = (gw_choice){.index = 1,
                                 .text = NULL,
                                 .text_len = 0,
                                 .n_tokens = 4,
                                 .prompt_tokens = 5,
                                 .stop_reason = SPECD__STOP_REASON__STOP_REASON_LENGTH};
    char *s = gw_response_json(&job, "m");
    assert_non_null(s);
    cJSON *r = cJSON_Parse(s);
    assert_non_null(r);
    assert_string_equal(cJSON_GetObjectItem(r, "object")->valuestring, "chat.completion");
    const cJSON *ch = cJSON_GetObjectItem(r, "choices");
    assert_int_equal(cJSON_GetArraySize(ch), 2);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 0), "finish_reason")->valuestring, "stop");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 1), "finish_reason")->valuestring, "length");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 0), "logprobs")));
    const cJSON *u = cJSON_GetObjectItem(r, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 5); /* one prompt, n = 2 */
    assert_int_equal(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 7);
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, 12);
    cJSON_Delete(r);
    assert_non_null(strstr(s, "\"content\":\"a\\\"b\\n\\u0001\\u0000z\""));
    free(s);
    s = gw_chunk_json(&job, "m", 1, true, NULL, 0, 0, 0, false, true);
    assert_string_equal(s, "{\"id\":\"chatcmpl-x\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
                           "\"model\":\"m\",\"choices\":[{\"index\":1,\"delta\":{\"role\":\"assistant\","
                           "\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}");
    free(s);
    gw_error err;
    gw_fail(&err, 400, "invalid_request_error", NULL, "top_p", "bad %d", 1);
    s = gw_error_json(&err);
    assert_string_equal(s, "{\"error\":{\"message\":\"bad 1\",\"type\":\"invalid_request_error\",\"param\":\"top_p\","
                           "\"code\":null}}");
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_defaults),
        cmocka_unit_test(test_neutral_fields),
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_response_format),
        cmocka_unit_test(test_guided),
        cmocka_unit_test(test_tools),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_prompts),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_key_and_seed),
        cmocka_unit_test(test_responses),
        cmocka_unit_test(test_logprobs_penalties),
        cmocka_unit_test(test_logprob_responses),
        cmocka_unit_test(test_echo),
        cmocka_unit_test(test_echo_logprob_responses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

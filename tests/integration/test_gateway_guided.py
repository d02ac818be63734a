"""vLLM's structured-output fields (guided_json, guided_regex,
guided_grammar, guided_choice) through specd-gateway with the official
`openai` client's extra_body (issue 35), on SmolLM2 with the n-gram drafter
(K fixed at 4):

- chat with guided_json (the schema as an object, and as its text): the
  content equals specd-generate --chat --json-schema's text and validates;
- completions with guided_regex: specd-generate --regex's text, which
  matches the regex (Python's re);
- completions with guided_grammar: specd-generate --grammar's text;
- chat with guided_choice, choices holding a quote, a backslash and a
  non-ASCII letter: the content is one of the choices, and equals
  specd-generate --grammar's text for the same alternation written by hand;
- two guided_* fields, or one with response_format / grammar, is a 400
  naming the field; guided_whitespace_pattern is a 400 naming it."""
import json
import os
import re
import subprocess

import harness as H

try:
    import openai
except ImportError:
    openai = None
try:
    import jsonschema
except ImportError:
    jsonschema = None

TOKENS = 40
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
REGEX = " [0-9]{1,3} (apples|pears)\\."
GRAMMAR = 'root ::= " " ("red" | "green" | "blue") ", " ("red" | "green" | "blue") "."\n'
CHOICES = ["yes", 'a "quoted" no', "back\\slash", "déjà vu"]
CHOICE_GBNF = 'root ::= "yes" | "a \\"quoted\\" no" | "back\\\\slash" | "déjà vu"\n'


def generate(h, model, prompt, flag, value, chat):
    argv = [h.bin("generate"), "-m", model, "-p", prompt, "-n", str(TOKENS), "--json", "-t", "1", flag, value]
    argv += ["--chat"] if chat else []
    r = subprocess.run(argv, capture_output=True, timeout=600)
    H.check(r.returncode == 0, "specd-generate %s failed: %s" % (flag, r.stderr[-1000:]))
    return json.loads(r.stdout)["text"]


def run(h):
    if openai is None:
        H.skip("the openai package is not installed in the test venv (tests/ref/requirements.txt)")
    model = h.smollm()

    def tmp(name, text):
        p = os.path.join(h.tmp, name)
        with open(p, "w") as f:
            f.write(text)
        return p
    q_person, q_choice = "Give me a person as JSON.", "Answer in a few words: is the sky green?"
    p_regex, p_gram = "The basket holds", "Two primary colors are"
    ref_person = generate(h, model, q_person, "--json-schema", tmp("person.json", json.dumps(PERSON)), True)
    ref_regex = generate(h, model, p_regex, "--regex", REGEX, False)
    ref_gram = generate(h, model, p_gram, "--grammar", tmp("colors.gbnf", GRAMMAR), False)
    ref_choice = generate(h, model, q_choice, "--grammar", tmp("choice.gbnf", CHOICE_GBNF), True)
    H.log("references: %r / %r / %r / %r" % (ref_person, ref_regex, ref_gram, ref_choice))
    h.start_service(model, drafter="ngram", coord_extra=H.FIXED_K)
    h.start_gateway(["--model-name", "smollm"])
    cl = openai.OpenAI(base_url=h.http_url + "/v1", api_key="none", max_retries=0, timeout=300)
    greedy = dict(model="smollm", temperature=0, max_tokens=TOKENS)

    def chat(q, extra):
        r = cl.chat.completions.create(messages=[{"role": "user", "content": q}], extra_body=extra, **greedy)
        return r.choices[0].message.content

    for schema in (PERSON, json.dumps(PERSON)):
        text = chat(q_person, {"guided_json": schema})
        H.check(text == ref_person, "guided_json (%s): %r, specd-generate %r" % (type(schema).__name__, text,
                                                                                  ref_person))
        v = json.loads(text)
        if jsonschema is not None:
            jsonschema.validate(v, PERSON)
    text = cl.completions.create(prompt=p_regex, extra_body={"guided_regex": REGEX}, **greedy).choices[0].text
    H.check(text == ref_regex and re.fullmatch(REGEX, text), "guided_regex: %r, specd-generate %r" % (text,
                                                                                                     ref_regex))
    text = cl.completions.create(prompt=p_gram, extra_body={"guided_grammar": GRAMMAR}, **greedy).choices[0].text
    H.check(text == ref_gram, "guided_grammar: %r, specd-generate %r" % (text, ref_gram))
    text = chat(q_choice, {"guided_choice": CHOICES})
    H.check(text in CHOICES and text == ref_choice, "guided_choice: %r, specd-generate %r" % (text, ref_choice))
    H.log("guided_json / guided_regex / guided_grammar / guided_choice: specd-generate's text (choice %r)" % text)

    for extra, param in (({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
                         ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
                         ({"guided_json": PERSON, "grammar": GRAMMAR}, "guided_json"),
                         ({"guided_choice": []}, "guided_choice"),
                         ({"guided_json": PERSON, "guided_whitespace_pattern": " *"}, "guided_whitespace_pattern")):
        try:
            chat(q_person, extra)
            H.check(False, "%s was accepted" % extra)
        except openai.BadRequestError as e:
            H.check(e.status_code == 400 and e.param == param, "%s: %s param %s (%s)" % (extra, e.status_code,
                                                                                          e.param, e.message))
            H.log("refused: %s" % e.message)


if __name__ == "__main__":
    H.main(run)

#!/usr/bin/env python3
"""Oracle: specd's GBNF grammars (engine/constrain/gbnf.c) against Lark's
Earley parser, on grammars written twice by hand: once in GBNF for specd,
once in Lark's notation (recursion, alternation, * + ? {m,n}, classes,
negated classes, escapes, string literals).

The Lark grammars use single-character terminals only (checked): Lark's
Earley parser then reads one character per Earley set, and by Earley's
correct-prefix property it raises UnexpectedCharacters at the first
character no derivation can take, and UnexpectedEOF when the whole text is
a proper prefix of some sentence (every rule here derives some string).
So one parse answers three ways: sentence, viable prefix, refused.

Without a model (tests/constrain_cli gbnf, specd's matcher):
  - hand-written sentences and non-sentences of each grammar: Lark and
    specd both accept the first and refuse the second;
  - 150 random sentences generated from the Lark grammar are accepted by
    specd;
  - 300 mutations of them (a character changed, inserted or dropped): specd
    accepts exactly those Lark parses.
With the demo model (SPECD_MODEL, specd-generate built): two prompts per
grammar, greedy and two seeded sampled runs (--temp 0.9 --seed 1, 2):
  - an output that ended by end-of-sequence parses whole with Lark;
  - an output cut at -n is a viable prefix (UnexpectedEOF, not
    UnexpectedCharacters) or a whole sentence;
  - at least a third of all runs ended by end-of-sequence, so the whole-
    sentence check is not vacuous;
  - negative control: each output with a character inserted that no
    sentence of its grammar holds (the grammar's `absent`) is refused by
    Lark (UnexpectedCharacters), so the oracle can fail.

Exit 0: all agree; 1: a mismatch (printed); 77: skipped.
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

SKIP = 77
try:
    from lark import Lark
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF
    from lark.lexer import PatternStr
except ImportError:
    print("SKIP: the lark package is missing; run scripts/setup")
    sys.exit(SKIP)

SRC = os.environ.get("SPECD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("SPECD_BUILD_DIR", os.path.join(SRC, "build"))
CLI = os.path.join(BUILD, "tests", "constrain_cli")
GEN = os.path.join(BUILD, "tools", "specd-generate")
POOL = "abcdefghijklmnopqrstuvwxyzAEXYZ0123456789 \n\t\"\\/.,;:=+-*()[]{}!?_é\x01"

# Each: the GBNF specd reads, the same language in Lark (start rule root),
# prompts for the model, hand-written sentences and non-sentences, and a
# character that occurs in no sentence (the negative control's).
GRAMMARS = [
    dict(name="arith", absent="\x01", gbnf=r'''
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
''', lark=r'''
root: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: DIGIT+ | "(" expr ")" | "-" factor
DIGIT: /[0-9]/
''', prompts=["Compute: 3*(4+5) = ", "A long arithmetic expression with parentheses: "],
         valid=["7", "12+3*(4-5)", "-(-7)/2", "((1))", "1-2-3*4/5"],
         invalid=["", "1+", "(1", "1)", "a", "1++2", "+1", "()", "1 + 2"]),

    dict(name="key_value", absent="\n", gbnf=r'''
# key=value pairs separated by "; ", ending with a period
root  ::= pair ("; " pair){0,4} "."
pair  ::= key "=" value
key   ::= [a-z_] [a-z0-9_]{0,11}
value ::= [0-9]+ | "\"" [^"\n]* "\"" | "true" | "false"
''', lark=r'''
root: pair (";" " " pair) ~ 0..4 "."
pair: key "=" value
key: KEYSTART KEYCHAR ~ 0..11
value: DIGIT+ | "\"" STRCHAR* "\"" | "t" "r" "u" "e" | "f" "a" "l" "s" "e"
KEYSTART: /[a-z_]/
KEYCHAR: /[a-z0-9_]/
DIGIT: /[0-9]/
STRCHAR: /[^"\n]/
''', prompts=["Server settings as key=value pairs: ", "Describe a user account: "],
         valid=["a=1.", "_x=true; y2=\"hi there\"; z=false.", "k=\"\".", "a=1; b=2; c=3; d=4; e=5.",
                "abcdefghijkl=0.", "s=\"é;=.\"."],
         invalid=["a=1", "a=1; b=2; c=3; d=4; e=5; f=6.", "1a=1.", "a=tru.", "a=1;b=2.", "abcdefghijklm=0.",
                  "a=\"x\ny\".", "A=1.", "a=1.."]),

    dict(name="json_like", absent="\x01", gbnf=r'''
root   ::= object
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws (member ("," ws member)*)? ws "}"
member ::= string ws ":" ws value
array  ::= "[" ws (value ("," ws value)*)? ws "]"
string ::= "\"" ([^"\\\x00-\x1f] | "\\" ["\\/bfnrt])* "\""
number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws     ::= [ \n]?
''', lark=r'''
root: object
value: object | array | string | number | "t" "r" "u" "e" | "f" "a" "l" "s" "e" | "n" "u" "l" "l"
object: "{" ws (member ("," ws member)*)? ws "}"
member: string ws ":" ws value
array: "[" ws (value ("," ws value)*)? ws "]"
string: "\"" (CHAR | "\\" ESC)* "\""
number: "-"? ("0" | NONZERO DIGIT*) ("." DIGIT+)? (EXP SIGN? DIGIT+)?
ws: WS?
CHAR: /[^"\\\x00-\x1f]/
ESC: /["\\\/bfnrt]/
NONZERO: /[1-9]/
DIGIT: /[0-9]/
EXP: /[eE]/
SIGN: /[-+]/
WS: /[ \n]/
''', prompts=["A JSON object describing a book: ", "Return the weather as JSON: "],
         valid=["{}", "{ }", '{"a":1}', '{"a": [1, -2.5e+3, "x\\n", true, null, {}]}', '{\n"k":{"q":[]},"z":0.0}',
                '{"é":"\\\\"}',
                '{"s":"\\/\\b\\f\\r\\t\\"\\\\"}'],
         invalid=["", "{", '{"a"}', '{"a":01}', '{"a":[1,]}', "[]", '{"a":1}}', '{"\\q":1}', '{"a":1.}',
                  '{  "a":1}']),

    dict(name="csv", absent="\x01", gbnf=r'''
root ::= row{1,3}
row  ::= cell ("," cell){2} "\n"
cell ::= [A-Za-z] [A-Za-z ]{0,9} | [0-9]{1,4} ("." [0-9]{1,2})?
''', lark=r'''
root: row ~ 1..3
row: cell ("," cell) ~ 2 "\n"
cell: ALPHA ALPHASP ~ 0..9 | DIGIT ~ 1..4 ("." DIGIT ~ 1..2)?
ALPHA: /[A-Za-z]/
ALPHASP: /[A-Za-z ]/
DIGIT: /[0-9]/
''', prompts=["name,age,city\n", "A table of fruit prices (fruit,price,stock):\n"],
         valid=["a,b,c\n", "Apple,1.25,30\nPear pie,0.5,7\n", "1,2,3\n4,5,6\n7,8,9\n", "Abcdefghij,9999,x \n"],
         invalid=["a,b\n", "a,b,c", "a,b,c\n" * 4, " a,b,c\n", "1.234,b,c\n", "12345,b,c\n", "Abcdefghijk,1,2\n"]),

    dict(name="sexp", absent="\n", gbnf=r'''
root ::= "(" list ")"
list ::= sexp (" " sexp)*
sexp ::= atom | "(" list? ")"
atom ::= [a-z]+ | "-"? [0-9]+
''', lark=r'''
root: "(" list ")"
list: sexp (" " sexp)*
sexp: atom | "(" list? ")"
atom: LOWER+ | "-"? DIGIT+
LOWER: /[a-z]/
DIGIT: /[0-9]/
''', prompts=["A Lisp expression that adds three numbers: ", "(define (square x) "],
         valid=["(a)", "(add 1 -2 (mul x 3))", "(())", "(a (b (c ())) d)"],
         invalid=["()", "(a", "a", "(a  b)", "( a)", "(A)", "(-x)", "(a)(b)"]),

    dict(name="verdict", absent="\n", gbnf=r'''
# a verdict, then a reason up to the first period (\x2e is ".")
root    ::= verdict ", " reason "\x2e"
verdict ::= "yes" | "no" | "maybe" | "Yes" | "No"
reason  ::= [^.\n]{1,60}
''', lark=r'''
root: verdict "," " " reason "."
verdict: "y" "e" "s" | "n" "o" | "m" "a" "y" "b" "e" | "Y" "e" "s" | "N" "o"
reason: NOTDOT ~ 1..60
NOTDOT: /[^.\n]/
''', prompts=["Is the sky blue? Answer: ", "Should I learn C? "],
         valid=["yes, because.", "No, it is not!.", "maybe, " + "é" * 60 + ".", "Yes, \t\"x\"."],
         invalid=["yes.", "yes, .", "yes, a.b.", "YES, a.", "no, " + "a" * 61 + ".", "no, a\nb.", "no, a"]),

    dict(name="bullets", absent="\x01", gbnf=r'''
root ::= item ("\n" item){0,3}
item ::= "- " [A-Z] [a-z]* (" " word)* [!?]?
word ::= [a-z]+ | [0-9]+ "%"
''', lark=r'''
root: item ("\n" item) ~ 0..3
item: "-" " " UPPER LOWER* (" " word)* MARK?
word: LOWER+ | DIGIT+ "%"
UPPER: /[A-Z]/
LOWER: /[a-z]/
DIGIT: /[0-9]/
MARK: /[!?]/
''', prompts=["Shopping list:\n", "Three reasons to exercise:\n"],
         valid=["- A", "- Milk\n- Eggs and bread!", "- Up 50% today?\n- B\n- C\n- D"],
         invalid=["", "-A", "- a", "- A\n", "- A\n- B\n- C\n- D\n- E", "- A !", "- A 5", "- A!!"]),
]

RUNS = [[], ["--temp", "0.9", "--seed", "1"], ["--temp", "0.9", "--seed", "2"]]


def lark_parser(g):
    """Lark's Earley parser of g's Lark grammar; every terminal is one character."""
    p = Lark(g["lark"], start="root", parser="earley", lexer="dynamic")
    for t in p.terminals:
        if t.pattern.min_width != 1 or t.pattern.max_width != 1:
            raise ValueError("%s: terminal %s is not one character" % (g["name"], t.name))
    return p


def lark_verdict(p, text):
    """'sentence', 'prefix' (a proper prefix of some sentence) or 'refused'."""
    try:
        p.parse(text)
        return "sentence"
    except UnexpectedEOF:
        return "prefix"
    except UnexpectedCharacters:
        return "refused"


def sentence_generator(p):
    """A function rng -> a random sentence of p's grammar: expansions chosen
    at random, then, past depth 10, among those of least height."""
    rules = {}
    for r in p.rules:
        rules.setdefault(r.origin.name, []).append(r.expansion)
    chars = {}
    for t in p.terminals:
        if isinstance(t.pattern, PatternStr):
            chars[t.name] = [t.pattern.value]
        else:
            chars[t.name] = [c for c in POOL if re.fullmatch(t.pattern.to_regexp(), c)]
    height = {}
    changed = True
    while changed:  # least derivation height of each rule (fixpoint)
        changed = False
        for name, exps in rules.items():
            hs = [1 + max([height.get(s.name, 0 if s.is_term else 10**9) for s in e] or [0]) for e in exps]
            if min(hs) < height.get(name, 10**9):
                height[name] = min(hs)
                changed = True

    def exp_height(e):
        return max([0 if s.is_term else height[s.name] for s in e] or [0])

    def gen(rng, name, depth, out):
        exps = rules[name]
        if depth > 10:
            least = min(exp_height(e) for e in exps)
            exps = [e for e in exps if exp_height(e) == least]
        for s in rng.choice(exps):
            if s.is_term:
                out.append(rng.choice(chars[s.name]))
            else:
                gen(rng, s.name, depth + 1, out)

    def sentence(rng):
        out = []
        gen(rng, "root", 0, out)
        return "".join(out)

    return sentence


def mutate(rng, s):
    i = rng.randint(0, len(s))
    c = rng.choice(POOL)
    r = rng.random()
    if r < 0.4 and i < len(s):
        return s[:i] + c + s[i + 1:]
    if r < 0.7 or not s:
        return s[:i] + c + s[i:]
    i = min(i, len(s) - 1)
    return s[:i] + s[i + 1:]


def cli_match(gbnf_path, strings):
    inp = "".join(s.encode("utf-8").hex() + "\n" for s in strings)
    out = subprocess.run([CLI, "gbnf", gbnf_path], input=inp, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError("constrain_cli gbnf %s failed (%d): %s %s" % (gbnf_path, out.returncode,
                                                                          out.stdout[-400:], out.stderr[-400:]))
    return [line == "1" for line in out.stdout.split("\n") if line]


def matcher_check(g, p, path, rng):
    """specd's matcher against Lark on hand-written, generated and mutated strings."""
    bad = 0
    for s in g["valid"] + g["invalid"]:  # the hand-written ones hold for Lark itself
        if (lark_verdict(p, s) == "sentence") != (s in g["valid"]):
            bad += 1
            print("%s: Lark says %s for the hand-written %r" % (g["name"], lark_verdict(p, s), s))
    sentence = sentence_generator(p)
    generated = [sentence(rng) for _ in range(150)]
    strings = g["valid"] + g["invalid"] + generated + [mutate(rng, rng.choice(generated)) for _ in range(300)]
    got = cli_match(path, strings)
    n_sentences = 0
    for s, acc in zip(strings, got):
        want = lark_verdict(p, s) == "sentence"
        n_sentences += want
        if acc != want:
            bad += 1
            if bad <= 10:
                print("%s: MISMATCH on %r: specd %s, Lark %s" % (g["name"], s, acc, lark_verdict(p, s)))
    print("%s: %d strings matched (%d sentences)" % (g["name"], len(strings), n_sentences))
    return bad


def model_check(g, p, path, model, rng):
    """Returns (problems, runs, runs ended by end-of-sequence)."""
    bad = runs = eos = 0
    for prompt in g["prompts"]:
        for extra in RUNS:
            argv = [GEN, "-m", model, "-p", prompt, "-n", "40", "--json", "-t", "1", "--grammar", path] + extra
            out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                print("%s: specd-generate %s failed: %s" % (g["name"], extra, out.stderr[-400:]))
                bad += 1
                continue
            r = json.loads(out.stdout)
            text, stop = r["text"], r["stop_reason"]
            runs += 1
            eos += stop == "eos"
            v = lark_verdict(p, text)
            if v != "sentence" and (stop == "eos" or v == "refused"):
                bad += 1
                print("%s: OUTPUT %r (%s) %s: Lark says %s" % (g["name"], text, stop, extra, v))
            else:
                print("%s %s: %r (%s; Lark: %s)" % (g["name"], extra, text, stop, v))
            i = rng.randint(0, len(text))
            corrupt = text[:i] + g["absent"] + text[i:]
            if lark_verdict(p, corrupt) != "refused":
                bad += 1
                print("%s: negative control %r not refused by Lark" % (g["name"], corrupt))
    return bad, runs, eos


def main():
    model = os.environ.get("SPECD_MODEL")
    have_cli = os.path.exists(CLI)
    have_model = bool(model) and os.path.exists(model) and os.path.exists(GEN)
    if not have_cli and not have_model:
        print("SKIP: neither %s nor specd-generate with SPECD_MODEL" % CLI)
        return SKIP
    if not have_model:
        print("model part skipped (no SPECD_MODEL or specd-generate)")
    rng = random.Random(35)
    bad = runs = eos = 0
    with tempfile.TemporaryDirectory() as tmp:
        for g in GRAMMARS:
            p = lark_parser(g)
            path = os.path.join(tmp, g["name"] + ".gbnf")
            with open(path, "w") as f:
                f.write(g["gbnf"])
            if have_cli:
                bad += matcher_check(g, p, path, rng)
            if have_model:
                b, n, e = model_check(g, p, path, model, rng)
                bad, runs, eos = bad + b, runs + n, eos + e
    if have_model:
        print("%d runs, %d ended by end-of-sequence" % (runs, eos))
        if eos * 3 < runs:
            bad += 1
            print("too few runs ended by end-of-sequence for the whole-sentence check to mean much")
    print("%d grammars, %d problems" % (len(GRAMMARS), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

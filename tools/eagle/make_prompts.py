"""make_prompts.py — writes tools/eagle/prompts/train.txt, the prompt set
the EAGLE-3 head of the demo model is trained on (one prompt a line, "\\n"
escapes, bench/prompts' format).

Three kinds, none of them in bench/prompts (the benchmark's prompts stay
held out; the script refuses an overlap):
  * chat: question templates crossed with topics, both written for this
    project (part of specd, under its licence);
  * code edits: small functions taken from the Python standard library's
    source as it ships in Debian's python3.11 packages (Python Software
    Foundation License), with an edit, explain or test request written
    here;
  * summarization: docstrings of standard-library modules and functions
    (same source and licence), with a request to summarize.
Deterministic for a given Python (seeded); the committed file is what
trained the head, so rerunning on another Python only matters to
regenerate it.

Usage: .venv/bin/python tools/eagle/make_prompts.py [OUT]
"""
import ast
import importlib
import inspect
import os
import random
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

TOPICS = [
    "photosynthesis", "the water cycle", "how vaccines work", "black holes", "plate tectonics",
    "the immune system", "compound interest", "inflation", "supply and demand", "the stock market",
    "how airplanes fly", "how a refrigerator works", "electric cars", "solar panels", "wind turbines",
    "the internet", "public key cryptography", "how search engines rank pages", "machine learning",
    "databases", "version control", "recursion", "sorting algorithms", "hash tables", "binary search",
    "the Roman Empire", "the printing press", "the industrial revolution", "ancient Egypt",
    "the French Revolution", "the history of the bicycle", "the moon landing", "coffee", "tea",
    "bread baking", "composting", "houseplants", "birdwatching", "running a marathon", "yoga",
    "sleep hygiene", "meditation", "learning a new language", "public speaking", "job interviews",
    "writing a resume", "budgeting", "saving for retirement", "renting an apartment", "moving to a new city",
    "volcanoes", "earthquakes", "hurricanes", "climate change", "recycling", "bees", "octopuses",
    "whales", "dinosaurs", "the solar system", "Mars", "the speed of light", "gravity", "magnetism",
    "electricity", "batteries", "DNA", "evolution", "the human heart", "the brain", "nutrition",
    "vitamins", "chess", "music theory", "jazz", "painting with watercolors", "photography",
    "the Olympic games", "soccer", "time zones", "calendars", "maps", "the metric system",
    "prime numbers", "probability", "statistics", "the Pythagorean theorem", "fractions",
    "spreadsheets", "email etiquette", "remote work", "team meetings", "open source software",
    "operating systems", "compilers", "computer memory", "GPUs", "caching", "networks and routers",
]

TEMPLATES = [
    "Explain {t} in simple terms.",
    "What are three interesting facts about {t}?",
    "Give me a short introduction to {t} for a beginner.",
    "Why is {t} important?",
    "Write a short paragraph about {t}.",
    "What are common misconceptions about {t}?",
    "How would you explain {t} to a ten-year-old?",
    "List the key ideas behind {t}.",
    "Write a haiku about {t}.",
    "What questions should I ask to learn more about {t}?",
    "Summarize what you know about {t} in three sentences.",
    "What is the history of {t}, briefly?",
]

EXTRA_CHAT = [
    "Write a friendly email inviting my neighbours to a small garden party on Saturday.",
    "Suggest five names for a new bakery.",
    "What should I pack for a three-day hiking trip?",
    "Give me a simple recipe for vegetable soup.",
    "How do I politely decline a meeting invitation?",
    "Write a short story about a robot who learns to paint.",
    "What are some tips for keeping a tidy desk?",
    "Plan a one-day sightseeing itinerary for a city with a river and an old town.",
    "How can I get better at remembering names?",
    "Write a limerick about a cat who loves boxes.",
    "What is a good morning routine for someone who works from home?",
    "Give me three ideas for a rainy-day activity with children.",
    "How do I start learning to play the guitar?",
    "Write a thank-you note to a teacher.",
    "What are the pros and cons of living in a big city?",
    "Describe a sunset over the sea in a few sentences.",
    "How do I make my houseplants grow better?",
    "Write a product description for a reusable water bottle.",
    "What is the difference between a virus and a bacterium?",
    "Give me a weekly exercise plan for a beginner.",
]

CODE_MODULES = ["textwrap", "statistics", "colorsys", "string", "fnmatch", "shlex", "base64", "bisect",
                "heapq", "calendar", "glob", "posixpath", "difflib", "html", "ipaddress", "random",
                "fractions", "json.encoder", "urllib.parse", "email.utils", "csv", "gettext", "locale"]

CODE_TASKS = [
    "Add a docstring to this function and return the complete function:\n\n{src}",
    "Explain what this function does, step by step:\n\n{src}",
    "Write two unit tests for this function:\n\n{src}",
    "Add type hints to this function and return the whole function:\n\n{src}",
    "Rename the function {name} to {name}_v2 and return the whole code:\n\n{src}",
    "Is there a bug in this function? Explain briefly.\n\n{src}",
]

SUM_TASKS = [
    "Summarize the following text in two sentences:\n\n{doc}",
    "Give a one-paragraph summary of this documentation:\n\n{doc}",
    "What are the main points of this text?\n\n{doc}",
]


def small_functions():
    """(name, source) of standard-library functions of 4 to 18 lines."""
    out = []
    for mod in CODE_MODULES:
        try:
            m = importlib.import_module(mod)
            src = inspect.getsource(m)
        except (ImportError, OSError, TypeError):
            continue
        for node in ast.parse(src).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
                seg = ast.get_source_segment(src, node)
                n = seg.count("\n") + 1 if seg else 0
                if 4 <= n <= 18 and "\t" not in seg and "\\" not in seg:
                    out.append((node.name, seg))
    return out


def docstrings():
    """Standard-library docstrings of 300 to 1500 characters."""
    out = []
    for mod in CODE_MODULES + ["collections", "functools", "itertools", "pathlib", "argparse", "logging",
                               "contextlib", "dataclasses", "enum", "threading", "queue", "zipfile",
                               "tarfile", "sqlite3", "decimal", "datetime", "shutil", "tempfile"]:
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        objs = [m] + [getattr(m, n) for n in sorted(dir(m)) if not n.startswith("_")]
        for o in objs:
            d = inspect.getdoc(o) if (inspect.ismodule(o) or inspect.isfunction(o) or inspect.isclass(o)) else None
            if d and 300 <= len(d) <= 1500 and getattr(o, "__module__", mod) in (mod, None) or (
                    d and inspect.ismodule(o) and 300 <= len(d) <= 1500):
                out.append(textwrap.dedent(d).strip())
    return sorted(d for d in set(out) if "\\" not in d)


def main(argv):
    out_path = argv[1] if len(argv) > 1 else os.path.join(HERE, "prompts", "train.txt")
    rnd = random.Random(20261201)
    chat = [t.format(t=topic) for topic in TOPICS for t in TEMPLATES]
    rnd.shuffle(chat)
    chat = chat[:300] + EXTRA_CHAT
    funcs = small_functions()
    rnd.shuffle(funcs)
    code = [rnd.choice(CODE_TASKS).format(name=n, src=s) for n, s in funcs[:110]]
    docs = docstrings()
    rnd.shuffle(docs)
    summ = [rnd.choice(SUM_TASKS).format(doc=d) for d in docs[:90]]
    prompts = chat + code + summ
    rnd.shuffle(prompts)
    bench = set()
    bdir = os.path.join(ROOT, "bench", "prompts")
    for f in os.listdir(bdir):
        with open(os.path.join(bdir, f), encoding="utf-8") as fh:
            bench |= {ln.rstrip("\n").replace("\\n", "\n") for ln in fh if ln.strip()}
    overlap = [p for p in prompts if p in bench]
    if overlap:
        raise SystemExit(f"make_prompts: {len(overlap)} prompts are in bench/prompts: {overlap[:2]}")
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(f"# EAGLE-3 training prompts for the demo model: tools/eagle/make_prompts.py wrote this "
                f"({len(chat)} chat, {len(code)} code, {len(summ)} summarization); sources and licences in "
                f"tools/eagle/prompts/README.md\n")
        for p in prompts:
            f.write(p.replace("\n", "\\n") + "\n")
    print(f"{out_path}: {len(prompts)} prompts ({len(chat)} chat, {len(code)} code, {len(summ)} summarization)")


if __name__ == "__main__":
    main(sys.argv)

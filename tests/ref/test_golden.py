"""Golden check of the whole single-process path on the demo model.

SmolLM2-135M-Instruct, the ChatML-formatted question "What is the capital of
France?", greedy, 32 new tokens: specd-generate must produce exactly the token
ids stored in tests/data/golden_france.json, which were computed by the
independent numpy reference (tests/ref/llama_ref.py) with the prompt
tokenized by Hugging Face `tokenizers` (tests/ref/make_golden.py). The text
must plainly answer Paris.

specd-generate runs with --cpu-weights f32 (the Q4_1 matrices read as
f32): the reference computes on the dequantized weights with unrounded
activations, which is that path's function. With the matrices kept as stored
the CPU rounds activations to 8 bits, and this prompt's first token is a
near-tie ("The" vs "L", 0.08 apart in f32), so that path's text depends on
rounding flips (as small as another build's compiler flags); its
agreement with a reference that models the rounding is
tests/ref/test_forward_oracle.py's job.
"""
import json
import os
import subprocess
import sys

SKIP = 77


def main() -> int:
    src = os.environ.get("SPECD_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    build = os.environ.get("SPECD_BUILD_DIR", os.path.join(src, "build"))
    model = os.environ.get("SPECD_MODEL")
    if not model:
        try:
            model = subprocess.run([os.path.join(src, "tools", "fetch-model")], check=True,
                                   capture_output=True, text=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"skipped: demo model not available ({e})")
            return SKIP
    if not os.path.exists(model):
        print(f"skipped: demo model not found at {model}")
        return SKIP
    with open(os.path.join(src, "tests", "data", "golden_france.json")) as f:
        golden = json.load(f)

    exe = os.path.join(build, "tools", "specd-generate")
    # The golden prompt is this question in the model's ChatML template with
    # its default system prompt; 32 tokens are compared, past EOS.
    cmd = [exe, "-m", model, "--chat", "-p", "What is the capital of France?", "-n",
           str(len(golden["generated_ids"])), "--temp", "0", "--ignore-eos", "--json", "--cpu-weights", "f32"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        print("specd-generate failed:", run.returncode, run.stderr)
        return 1
    out = json.loads(run.stdout)
    ok = True
    if out["prompt_ids"] != golden["prompt_ids"]:
        print("prompt ids differ:\n specd:", out["prompt_ids"], "\n golden:", golden["prompt_ids"])
        ok = False
    if out["ids"] != golden["generated_ids"]:
        first = next((i for i, (a, b) in enumerate(zip(out["ids"], golden["generated_ids"])) if a != b),
                     min(len(out["ids"]), len(golden["generated_ids"])))
        print(f"generated ids differ from position {first}:\n specd:", out["ids"], "\n golden:",
              golden["generated_ids"])
        ok = False
    if "Paris" not in out["text"]:
        print("the answer does not mention Paris:", repr(out["text"]))
        ok = False
    print("specd text:", repr(out["text"]))
    print("timings:", out["timings"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

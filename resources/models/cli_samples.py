"""The README's sampled continuations, produced by Strata's own CLI (`main.py generate`).

    python resources/models/cli_samples.py > /tmp/samples.md
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evaluate_demo import MAX_NEW_TOKENS, PROMPTS, SAMPLE_SEED, TEMPERATURE  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def generate(prompt: str, temperature: float) -> str:
    cmd = [sys.executable, "main.py", "generate", "--model", "resources/models/demo", "--prompt", prompt,
           "--temperature", str(temperature), "--max-tokens", str(MAX_NEW_TOKENS), "--seed", str(SAMPLE_SEED),
           "--device", "cpu", "--json"]
    done = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["text"]


def main() -> None:
    print("| prompt | temperature | continuation |\n|---|---|---|")
    for prompt in PROMPTS:
        for temperature in (0.0, TEMPERATURE):
            text = generate(prompt, temperature).replace("|", "\\|").replace("\n", " ")
            print(f"| {prompt} | {temperature:g} | {text} |", flush=True)


if __name__ == "__main__":
    main()

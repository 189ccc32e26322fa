"""The course says everything in its own words: no run of 8 words shared with the source text.

The source text lives in ../shared/seed/ beside the repository. Every notebook's markdown and
the text its code cells print (stored stream and text/plain outputs) are compared with it after
normalising case and punctuation: a run of RUN or more consecutive words that also occurs in
the source text fails, naming the notebook, the cell and the words. Two things are left out:
LaTeX math ($...$, $$...$$), which is notation rather than sentences, and a short quotation in
quote marks with a credit to the text next to it (for instance `the text allows "..."`), which
is how the course cites the source. A close paraphrase is not something a test can find; those
are rewritten by reading.

Where the text is looked for: the folder WMDIST_SEED_DIR names, else ../shared/seed beside the
repository (where this course is written). A clone elsewhere has neither, and there the check
skips with its reason, CI=true or not (public CI services set CI=true by themselves, and the
README's test command must pass on such a clone). Where the text must be checked, naming its
folder makes the check strict: with WMDIST_SEED_DIR set and no text there, it fails. Our own
CI (.ci/run) sets it.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
SEED_DIR_VAR = "WMDIST_SEED_DIR"
REQUIRED = bool(os.environ.get(SEED_DIR_VAR))
SEED = Path(os.environ[SEED_DIR_VAR]) if REQUIRED else ROOT.parent / "shared" / "seed"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
RUN = 8
MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]*\$", re.S)
QUOTE = re.compile(r"\"[^\"]{3,300}\"|“[^”]{3,300}”")
CREDIT = re.compile(r"\b(the (source )?text|the seed|source text)\b", re.I)
CREDIT_REACH = 100          # characters before or after a quotation in which its credit must stand
BREAK = " \x00 "            # stands where text was cut out, so the words around it never join into one run


def words(text: str) -> list[str]:
    """Lower-case words of `text`: letters and digits only, every other character a separator.

    A BREAK marker becomes the token "\\x00", which occurs in no other text, so no run crosses it.
    """
    return [w for w in re.split(r"[^0-9a-z\x00]+", text.lower().replace("’", "'").replace("'", "")) if w]


def strip_exempt(text: str) -> str:
    """`text` without LaTeX math and without quotations that carry a credit to the source text."""
    text = MATH.sub(BREAK, text)
    out, last = [], 0
    for m in QUOTE.finditer(text):
        near = text[max(0, m.start() - CREDIT_REACH):m.start()] + text[m.end():m.end() + CREDIT_REACH]
        if CREDIT.search(near):
            out += [text[last:m.start()], BREAK]
            last = m.end()
    return "".join(out) + text[last:]


def seed_runs(seed_text: str, n: int = RUN) -> set[tuple[str, ...]]:
    """Every run of `n` consecutive words in the source text."""
    w = words(MATH.sub(BREAK, seed_text))
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def shared_runs(text: str, runs: set[tuple[str, ...]], n: int = RUN) -> list[str]:
    """The maximal stretches of `text` made of n-word runs that also occur in the source text."""
    w = words(strip_exempt(text))
    hit = [tuple(w[i:i + n]) in runs for i in range(len(w) - n + 1)]
    found, i = [], 0
    while i < len(hit):
        if hit[i]:
            j = i
            while j + 1 < len(hit) and hit[j + 1]:
                j += 1
            found.append(" ".join(w[i:j + n]))
            i = j + 1
        else:
            i += 1
    return found


def printed_text(cell: nbformat.NotebookNode) -> str:
    """What a code cell's stored outputs print: stream text and text/plain results."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return BREAK.join("".join(p) if isinstance(p, list) else p for p in parts)


def course_texts(path: Path) -> list[tuple[str, str]]:
    """(where, text) for every markdown cell and every code cell's printed output."""
    nb = nbformat.read(path, as_version=4)
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            out.append((f"{path.name} cell {i} (markdown)", cell.source))
        elif cell.cell_type == "code" and cell.get("outputs"):
            out.append((f"{path.name} cell {i} (output)", printed_text(cell)))
    return out


@pytest.fixture(scope="module")
def seed() -> set[tuple[str, ...]]:
    files = sorted(p for p in SEED.glob("*") if p.is_file()) if SEED.is_dir() else []
    if not files and REQUIRED:
        pytest.fail(f"{SEED_DIR_VAR}={SEED} names no folder of source text: the own-words check cannot run")
    if not files:
        pytest.skip(f"the source text is not at {SEED} (a clone without shared/ beside it): the own-words "
                    f"check cannot run; set {SEED_DIR_VAR} to the folder holding it to run it")
    return seed_runs("\n".join(p.read_text(encoding="utf-8") for p in files))


def test_helpers_find_runs_and_respect_credited_quotes():
    runs = seed_runs("Alpha beta gamma delta epsilon zeta eta theta iota kappa.")
    assert shared_runs("We say: ALPHA, beta gamma-delta epsilon zeta eta theta!", runs) == [
        "alpha beta gamma delta epsilon zeta eta theta"]
    assert shared_runs("alpha beta gamma delta epsilon zeta eta", runs) == []          # 7 words
    assert shared_runs('The text says "alpha beta gamma delta epsilon zeta eta theta".', runs) == []
    assert shared_runs('We say "alpha beta gamma delta epsilon zeta eta theta".', runs) != []   # no credit
    assert shared_runs("alpha beta gamma delta $x$ epsilon zeta eta theta", runs) == []          # math cuts


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_run_of_eight_words_shared_with_the_source_text(path, seed):
    hits = [f"{where}: {run!r}" for where, text in course_texts(path) for run in shared_runs(text, seed)]
    assert not hits, "in the source text's own words:\n  " + "\n  ".join(hits)


# --- where the check runs: a clone elsewhere skips, a named folder is required ----------------

def _run_in_a_clone(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """The notebook check of this file, run by pytest in a clone with no shared/ beside it, CI=true."""
    clone = tmp_path / "clone"
    (clone / "tests").mkdir(parents=True)
    shutil.copy(__file__, clone / "tests" / "test_seed_overlap.py")
    (clone / "notebooks").symlink_to(ROOT / "notebooks")
    base = {k: v for k, v in os.environ.items() if k != SEED_DIR_VAR}
    test = f"{clone / 'tests' / 'test_seed_overlap.py'}::test_no_run_of_eight_words_shared_with_the_source_text"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test],
                          cwd=clone, env={**base, "CI": "true", **env}, capture_output=True, text=True, timeout=300)


def test_a_clone_elsewhere_skips_the_check_with_its_reason_even_under_ci(tmp_path):
    done = _run_in_a_clone(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(NOTEBOOKS)} skipped" in done.stdout and "failed" not in done.stdout and "error" not in done.stdout
    assert f"the source text is not at {tmp_path / 'shared' / 'seed'}" in done.stdout
    assert SEED_DIR_VAR in done.stdout                      # the reason says how to run it


def test_a_named_seed_folder_without_the_text_fails(tmp_path):
    done = _run_in_a_clone(tmp_path, **{SEED_DIR_VAR: str(tmp_path / "no-seed-here")})
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{len(NOTEBOOKS)} error" in done.stdout and "skipped" not in done.stdout
    assert f"{SEED_DIR_VAR}={tmp_path / 'no-seed-here'} names no folder of source text" in done.stdout


def test_a_named_seed_folder_with_the_text_runs_the_check(tmp_path, seed):
    done = _run_in_a_clone(tmp_path, **{SEED_DIR_VAR: str(SEED)})
    assert done.returncode == 0 and f"{len(NOTEBOOKS)} passed" in done.stdout, done.stdout + done.stderr

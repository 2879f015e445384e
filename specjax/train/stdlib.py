"""The running interpreter's standard library as text to learn from: the corpus of the shipped
tiny checkpoints (`scripts/_corpus.py` tokenizes it) and the built-in `code` prompt set.

Every `.py` file under `sysconfig.get_paths()["stdlib"]`, recursively and in sorted order, is a
document, except files under `site-packages` (third-party code), under test directories
(`test`, `tests`, `idle_test`: CPython's test suite is larger than the library and very
repetitive) and files that are not valid UTF-8. A file goes to the validation split when
`md5(relative path) mod 50 == 0` (about 2% of the files), so no validation file is ever seen in
training. The set depends on the Python version; `train data` records the prompts' digest.

Code prompts are shaped like the ones people give a model: the start of a function (its
signature and docstring), the head of a module, and an instruction to edit a short function
followed by the start of the edited version (the answer then mostly copies the prompt). All
come from the training files only, so the held-out files stay unseen.
"""

from __future__ import annotations

import ast
import hashlib
import random
import sysconfig
import textwrap
from pathlib import Path

__all__ = ["code_prompts", "documents", "is_validation", "stdlib_root"]

HOLDOUT_MODULUS = 50
EXCLUDED_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_validation(relative: str) -> bool:
    """The held-out rule, on the POSIX relative path (e.g. 'json/decoder.py')."""
    return int(hashlib.md5(relative.encode()).hexdigest(), 16) % HOLDOUT_MODULUS == 0


def documents() -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[str]]:
    """(train, validation, skipped): (relative path, text) pairs in sorted path order."""
    root = stdlib_root()
    train, validation, skipped = [], [], []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        relative = path.relative_to(root).as_posix()
        if EXCLUDED_DIRS & set(path.relative_to(root).parts[:-1]) or not path.is_file():
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(relative)
            continue
        (validation if is_validation(relative) else train).append((relative, text))
    return train, validation, skipped


_EDITS = [  # (instruction, heading before the rewritten function)
    ("Add a docstring to this function", "With a docstring"),
    ("Add type hints to this function", "With type hints"),
    ("Rename the parameter `{old}` to `{new}` in this function", "After renaming"),
    ("Rewrite this function to be more readable", "Rewritten"),
]
_NEW_NAMES = ["value", "items", "data", "name", "count", "obj", "text", "result", "key", "path"]


def _functions(text: str):
    """(node, dedented source, docstring node or None, parameter names without self/cls) of
    every undecorated function of a module, nested ones included."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return
    lines = text.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.decorator_list:
            source = textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno])) + "\n"
            body = node.body[0]
            doc = (body if isinstance(body, ast.Expr) and isinstance(body.value, ast.Constant)
                   and isinstance(body.value.value, str) else None)
            params = [a.arg for a in node.args.args if a.arg not in ("self", "cls")]
            yield node, source, doc, params


def code_prompts(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (kind, prompt) pairs, a third each of 'function' (a signature and its docstring, to be
    continued), 'module' (a module's first lines up to its first definition) and 'edit' (a
    function of 3 to 15 lines, an instruction, and the first line of the edited function)."""
    functions, modules, edits = [], [], []
    train, _, _ = documents()
    for relative, text in train:
        head = []
        for line in text.splitlines()[:40]:
            head.append(line)
            if line.startswith(("def ", "class ")):
                if 3 <= len(head) and len("\n".join(head)) <= 1200:
                    modules.append("\n".join(head) + "\n")
                break
        for node, source, doc, params in _functions(text):
            lines = source.splitlines()
            if doc is not None and len(lines) > doc.end_lineno - node.lineno + 2:
                prompt = "\n".join(lines[:doc.end_lineno - node.lineno + 1]) + "\n"
                if len(prompt) <= 800:
                    functions.append(prompt)
            if 3 <= len(lines) <= 15 and len(source) <= 700:
                edits.append((source, params))
    rng = random.Random(seed)
    prompts = [("function", p) for p in rng.sample(functions, n // 3)]
    prompts += [("module", p) for p in rng.sample(modules, n // 3)]
    for source, params in rng.sample(edits, n - 2 * (n // 3)):
        # A rename needs a parameter to rename.
        instruction, heading = rng.choice([e for e in _EDITS if params or "{old}" not in e[0]])
        first = source.splitlines()[0]
        if "{old}" in instruction:
            old = rng.choice(params)
            new = rng.choice([name for name in _NEW_NAMES if name not in params])
            instruction = instruction.format(old=old, new=new)
            first = first.replace(f"({old}", f"({new}").replace(f" {old}", f" {new}")
        prompts.append(("edit", f"# {instruction}:\n\n{source}\n# {heading}:\n\n{first}\n"))
    rng.shuffle(prompts)
    return prompts

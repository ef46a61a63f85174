#!/usr/bin/env python3
"""Finds the coroutine shapes that GCC 12 miscompiles, in every C++ file of the tree.

GCC 12 (Debian 12's compiler, the one CI builds with) lowers a full-expression that holds a
`co_await` by hoisting its temporaries into the coroutine frame. Around the built-in conditional
operator it gets that wrong: both arms' temporaries are constructed, whichever the condition
picks, and the destructor of one runs twice (`co_await f(c ? T(1) : T(2))` frees one T's heap
memory twice: "free(): invalid pointer" once the coroutine frame ends). A `co_await` inside an
arm of `?:` crashes the same way when the other arm is taken, and one inside an operand of `&&`
or `||` can stop the compiler itself. So, in any full-expression that holds a `co_await`:

  * no `?:` at all (name the value first: `response r = c ? a() : b(); co_await f(std::move(r));`);
  * no built-in `&&` or `||` (test the awaited value in a statement of its own);
  * no lambda that holds copies (`[x]`, `[=]`, `[x = std::move(y)]`, `[*this]`): passed to a
    coroutine, such a temporary's copies were destroyed twice (`co_await off_thread([call =
    std::move(call)] { call(); })` corrupted the heap). Name the lambda first and move it in.
    Lambdas that capture only references or `this` are allowed.

Asio's awaitable operators (`co_await (a || b)`, `co_await (a && b)`) are overloaded functions,
not the built-in operators, and are allowed where the parenthesised operand follows `co_await`
directly. docs/architecture.md ("Coroutines") states the rule for people; this check keeps it.

Usage: coroutine_rules.py SOURCE_DIR   (exit 1 and one line per finding when any is found)
       coroutine_rules.py --self-test   (the check against shapes it must and must not report)
"""
import os
import re
import sys

SOURCE_FOLDERS = ("common", "kernels", "backend", "gateway", "monitoring", "cli", "tests")
SKIPPED = ("node_modules",)


def strip_comments_and_literals(text):
    """The text with comments, string and character literals blanked out (newlines kept)."""
    out = []
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delimiter = text[i + 2:open_paren]
            close = text.find(")" + delimiter + '"', open_paren)
            j = n if close < 0 else close + len(delimiter) + 2
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c in "\"'":
            # A digit separator (1'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * max(0, j - i - 2) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching(text, i, open_char, close_char):
    """The index just past the bracket that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_char:
            depth += 1
        elif text[j] == close_char:
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


BLOCK_WORDS = ("else", "do", "try", "mutable", "noexcept", "const", "override", "final")


def opens_block(code, segment_start, i):
    """Whether the '{' at code[i] opens a block (a body) rather than a braced initializer."""
    before = code[segment_start:i].rstrip()
    if not before or before[-1] in ")];{}:":
        return True
    word = re.search(r"([A-Za-z_]+)$", before)
    if word and word.group(1) in BLOCK_WORDS:
        return True
    # A lambda's trailing return type, or a type's or namespace's body.
    return "->" in before or re.search(r"\b(namespace|class|struct|enum|union|extern)\b", before) is not None


def full_expressions(code):
    """(offset, text) of each piece of code that is one full-expression or close to it: statements
    split at ';' and at the braces of blocks (a braced initializer stays in its expression), and
    the condition of if/while/for/switch apart from its body."""
    start = 0
    parens = 0
    inits = []  # for each open '{': whether it is a braced initializer
    for i, c in enumerate(code):
        if c == "(":
            parens += 1
        elif c == ")":
            parens -= 1
        elif c == "{":
            if sum(inits) == 0 and opens_block(code, start, i):
                inits.append(False)
                yield from split_condition(code, start, i)
                start = i + 1
                parens = 0
            else:
                inits.append(True)
        elif c == "}":
            initializer = inits.pop() if inits else False
            if not initializer:
                yield from split_condition(code, start, i)
                start = i + 1
                parens = 0
        elif c == ";" and parens <= 0 and sum(inits) == 0:
            yield from split_condition(code, start, i)
            start = i + 1
            parens = 0
    yield from split_condition(code, start, len(code))


def split_condition(code, start, end):
    piece = code[start:end]
    m = re.match(r"\s*(?:else\s+)?(if|while|for|switch)\s*(?:constexpr\s*)?\(", piece)
    if not m:
        yield start, piece
        return
    open_at = m.end() - 1
    close_at = matching(piece, open_at, "(", ")")
    yield start + open_at, piece[open_at:close_at]
    yield start + close_at, piece[close_at:]


AWAIT = re.compile(r"\bco_await\b")


def findings_in(code):
    for offset, expr in full_expressions(code):
        if not AWAIT.search(expr):
            continue
        # Asio's awaitable operators: `co_await ( ... || ... )` right after co_await.
        cleaned = expr
        for m in reversed(list(re.finditer(r"\bco_await\s*\(", expr))):
            open_at = m.end() - 1
            close_at = matching(expr, open_at, "(", ")")
            inner = expr[open_at:close_at]
            cleaned = cleaned[:open_at] + re.sub(r"&&|\|\|", "  ", inner) + cleaned[close_at:]
        # A lambda's parameters may be forwarding references (auto&& x): not an operator.
        cleaned = re.sub(r"\b(auto|[A-Za-z_][\w:<>]*)&&(\s*[A-Za-z_]\w*\s*[,)=])", r"\1  \2", cleaned)
        if "?" in cleaned:
            yield offset, "a conditional operator '?:' in a full-expression with co_await"
        elif re.search(r"&&|\|\|", cleaned):
            yield offset, "a built-in '&&' or '||' in a full-expression with co_await"
        elif any(owns_copies(captures) for captures in lambda_captures(expr)):
            yield offset, "a lambda holding copies in a full-expression with co_await"


# A lambda's introducer: '[' where an expression starts (not a subscript), its captures, then
# its parameters, body or the end of the piece (full_expressions splits at a body's brace).
LAMBDA = re.compile(r"(?:^|(?<=[(,={]))\s*\[([^\[\]]*)\]\s*(?=\(|\{|mutable|$)")


def lambda_captures(expr):
    return [m.group(1) for m in LAMBDA.finditer(expr)]


def owns_copies(captures):
    for capture in (c.strip() for c in captures.split(",")):
        if capture in ("", "&", "this") or capture.startswith("&"):
            continue
        return True
    return False


MUST_REPORT = [
    "co_await answer(busy ? unavailable(m) : invalid(m));",
    "co_await ex.respond(error_response(s, m, t,\n    p.empty() ? std::nullopt : std::optional<std::string_view>(p)));",
    "const read_outcome r = done ? parse(b) : co_await read(s, b);",
    "if (ready && co_await flush()) co_return;",
    "while (!stopped || co_await more()) { step(); }",
    "auto v = co_await f(T{c ? 1 : 2});",
    "const std::optional<bool> ran = co_await off_thread([call = std::move(call)] {\n call();\n return true;\n});",
    "co_await run(ex, [s] { s->go(); });",
    "co_await run([=](int x) { use(x); });",
]
MUST_PASS = [
    "response r = busy ? unavailable(m) : invalid(m);\nco_await answer(std::move(r));",
    "const auto woken = co_await (timer.async_wait(use_awaitable) || ex.watch_disconnect());",
    "if (a && b) { co_await f(); }",
    "if (!co_await sse->event(chunk)) co_return;",
    "co_return c ? x : y;",
    "routes.add(v, p, [s](exchange& ex) -> asio::awaitable<void> { co_await s->run(ex); });",
    "auto out = co_await asio::async_initiate<T, void(answer)>([this](auto&& resume) { go(resume); }, use_awaitable);",
    "const char* s = \"a ? b : c\"; co_await f(s); // a ? b : c",
    "auto run = [call = std::move(call)] { call(); };\nconst auto ran = co_await off_thread(std::move(run));",
    "std::optional<status> w = co_await t.off_thread([&t, &hold] { return t.store_->add_hold(hold); });",
    "co_await f(values[i], [this]() { go(); });",
]


def self_test():
    failures = 0
    for snippet in MUST_REPORT:
        if not list(findings_in(strip_comments_and_literals(snippet))):
            print(f"not reported: {snippet!r}")
            failures += 1
    for snippet in MUST_PASS:
        found = list(findings_in(strip_comments_and_literals(snippet)))
        if found:
            print(f"reported wrongly ({found[0][1]}): {snippet!r}")
            failures += 1
    return 1 if failures else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    found = 0
    for folder in SOURCE_FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames[:] = [d for d in dirnames if d not in SKIPPED]
            for name in sorted(filenames):
                if not name.endswith((".cpp", ".h", ".hpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                if "co_await" not in text:
                    continue
                code = re.sub(r"(?m)^[ \t]*#.*$", lambda m: " " * len(m.group(0)), strip_comments_and_literals(text))
                for offset, why in findings_in(code):
                    line = code.count("\n", 0, offset) + 1
                    while line <= text.count("\n") and not text.splitlines()[line - 1].strip():
                        line += 1
                    print(f"{os.path.relpath(path, root)}:{line}: {why}")
                    found += 1
    if found:
        print(f"{found} coroutine shape(s) that GCC 12 miscompiles (see tests/lint/coroutine_rules.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

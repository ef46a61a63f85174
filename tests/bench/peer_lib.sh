# shellcheck shell=bash
# shellcheck disable=SC2154  # $peer and $script are the caller's
# What the scripts that run llama.cpp's prebuilt binaries next to edgeinfer share. Source it
# after setting $peer (the folder of llama.cpp's binaries) and $script (the caller's name, for
# messages).
#
# skip_because TEXT...
#   Prints "$script: skipped: TEXT" and exits 77 (ctest's SKIP_RETURN_CODE).
# require_peer TOOL...
#   Skips unless every TOOL is an executable in $peer and llama.cpp runs on this CPU (the build
#   needs AVX-512 F, BW, VL, VBMI, VNNI and BF16, and stops with an illegal instruction at its
#   first kernel without them: its --version still runs).
# median_of FILE / range_of FILE
#   The median (the upper one of an even count) and "min-max" of the numbers in FILE, one a line.
# compare_greedy PEER_TEXT EDGE_TEXT PROMPT TOKENS
#   Compares llama-cli's output with edgeinfer generate's for PROMPT (TOKENS: how many edgeinfer
#   generated) as UTF-8 with each invalid byte sequence replaced (edgeinfer writes U+FFFD where a
#   token ends mid-character, llama-cli the raw bytes), leaving out what llama-cli cannot print:
#   it writes each token's text as a C string, so a token holding a NUL byte (random vocabularies
#   have them) loses the rest of its text there. Prints one line, and where they differ the first
#   differing character and both texts; returns 1 then.
peer_exit_skipped=77

skip_because() {
  echo "$script: skipped: $*"
  exit "$peer_exit_skipped"
}

require_peer() {
  local tool
  for tool in "$@"; do
    [[ -x "$peer/$tool" ]] || skip_because "no llama.cpp $tool in $peer"
  done
  # The binaries start on any x86-64 CPU (--version runs), and stop at the first kernel that
  # uses an instruction the CPU lacks: ask the CPU for every extension they were built with.
  local flags flag
  flags=$(grep -m1 '^flags' /proc/cpuinfo 2> /dev/null || true)
  for flag in avx512f avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16; do
    [[ " $flags " == *" $flag "* ]] ||
      skip_because "llama.cpp does not run on this CPU (it is built for AVX-512 with VBMI, VNNI and BF16; no $flag)"
  done
  "$peer/$1" --version > /dev/null 2>&1 || skip_because "llama.cpp does not run on this CPU"
}

median_of() {
  sort -g "$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

range_of() {
  sort -g "$1" | awk '{ v[NR] = $1 } END { printf "%.2f-%.2f", v[1], v[NR] }'
}

compare_greedy() {
  /usr/bin/python3 - "$@" <<'EOF'
import sys
peer_path, edge_path, prompt, tokens = sys.argv[1:5]
# llama-cli ends its output with a newline, and with " [end of text]" where generation stopped early.
peer = open(peer_path, "rb").read().decode("utf-8", "replace").rstrip("\n")
peer = peer[:-len(" [end of text]")] if peer.endswith(" [end of text]") else peer
ours = open(edge_path, "rb").read().decode("utf-8", "replace")

# Where edgeinfer's text has a NUL and llama.cpp's goes on with what follows it some characters
# later, those characters are a token's tail llama-cli did not print: skip them and go on.
longest_tail = 256  # characters of a token after its NUL, at most
resync = 16         # characters that must agree after a skipped tail
i = j = 0
tails = 0
while i < len(peer) and j < len(ours):
    if peer[i] == ours[j]:
        i, j = i + 1, j + 1
        continue
    if ours[j] != "\0":
        break
    want = peer[i:i + resync]
    k = next((k for k in range(1, longest_tail) if ours[j + k:j + k + len(want)] == want), None)
    if k is None:
        break
    j += k
    tails += 1
if i == len(peer) and j < len(ours) and ours[j] == "\0" and len(ours) - j < longest_tail:
    j, tails = len(ours), tails + 1
equal = i == len(peer) and j == len(ours)
verdict = "equal" if equal else "DIFFERENT"
if equal and tails:
    verdict += f" (leaving out {tails} token tail(s) after a NUL byte, which llama-cli does not print)"
print(f"  {prompt!r}: {tokens} tokens generated, text {verdict}")
if not equal:
    # Both print the prompt first: count from the end of the prompt where both have it.
    start = len(prompt) if peer.startswith(prompt) and ours.startswith(prompt) else 0
    print(f"    first difference at character {i - start} of llama.cpp's completion, {j - start} of edgeinfer's "
          f"({len(peer) - start} and {len(ours) - start} characters in all)")
    print(f"    llama.cpp: {peer!r}\n    edgeinfer: {ours!r}")
sys.exit(0 if equal else 1)
EOF
}

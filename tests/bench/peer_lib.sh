# shellcheck shell=bash
# What the scripts that run llama.cpp's prebuilt binaries next to edgeinfer share. Source it
# after setting $peer (the folder of llama.cpp's binaries) and $script (the caller's name, for
# messages).
#
# skip_because TEXT...
#   Prints "$script: skipped: TEXT" and exits 77 (ctest's SKIP_RETURN_CODE).
# require_peer TOOL...
#   Skips unless every TOOL is an executable in $peer and llama.cpp runs on this CPU (the build
#   needs AVX-512 and stops with an illegal instruction without it).
# median_of FILE / range_of FILE
#   The median (the upper one of an even count) and "min-max" of the numbers in FILE, one a line.
# compare_greedy PEER_TEXT EDGE_TEXT PROMPT TOKENS
#   Compares llama-cli's output with edgeinfer generate's for PROMPT (TOKENS: how many edgeinfer
#   generated) as UTF-8 with each invalid byte sequence replaced (edgeinfer writes U+FFFD where a
#   token ends mid-character, llama-cli the raw bytes). Prints one line, and where they differ the
#   first differing character of the completion and both texts; returns 1 then.
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
  "$peer/$1" --version > /dev/null 2>&1 || skip_because "llama.cpp does not run on this CPU (it needs AVX-512)"
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
print(f"  {prompt!r}: {tokens} tokens generated, text {'equal' if peer == ours else 'DIFFERENT'}")
if peer != ours:
    # Both print the prompt first: count from the end of the prompt where both have it.
    start = len(prompt) if peer.startswith(prompt) and ours.startswith(prompt) else 0
    at = next((i for i, (a, b) in enumerate(zip(peer, ours)) if a != b), min(len(peer), len(ours)))
    print(f"    first difference at character {at - start} of the completion "
          f"({len(peer) - start} characters from llama.cpp, {len(ours) - start} from edgeinfer)")
    print(f"    llama.cpp: {peer!r}\n    edgeinfer: {ours!r}")
sys.exit(0 if peer == ours else 1)
EOF
}

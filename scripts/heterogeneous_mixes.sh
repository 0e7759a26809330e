# The model mixes of the heterogeneous matrices (issue 28), sourced by heterogeneous_matrix.sh and
# heterogeneous_heldout.sh: every model writes English (E2), all four tiny models (A4), digits-only receivers
# with one English writer (D3), the two digits-only models (M2), the CODE mix (C3).
# shellcheck disable=SC2034  # used by the scripts that source it
E2='["dgrpo:tiny-arith-code-text","dgrpo:tiny-arith-text"]'
A4='["dgrpo:tiny-arith","dgrpo:tiny-arith-llama","dgrpo:tiny-arith-code-text","dgrpo:tiny-arith-text"]'
D3='["dgrpo:tiny-arith","dgrpo:tiny-arith-llama","dgrpo:tiny-arith","dgrpo:tiny-arith-text"]'
M2='["dgrpo:tiny-arith","dgrpo:tiny-arith-llama"]'
C3='["dgrpo:tiny-arith-code-text","dgrpo:tiny-arith","dgrpo:tiny-arith-llama","dgrpo:tiny-arith-code-text"]'

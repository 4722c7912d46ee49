# Helpers shared by the benchmark scripts (sourced, not run).

# Seconds in a line "...: 0.123 s ..." (or "12.3 ms"), after the line's first
# colon; empty if none.
secs_in() {
    sed 's/^[^:]*://' | awk '{
        if (match($0, /[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)? *(ms|s)([^A-Za-z]|$)/)) {
            t = substr($0, RSTART, RLENGTH); u = (t ~ /ms/) ? 1e-3 : 1
            sub(/ *m?s.*$/, "", t); printf "%.6f\n", t * u
        } }' | head -1
}

# The median of the numbers on stdin, one per line (nothing if none).
median() {
    sort -g | awk '{ a[NR] = $1 } END {
        if (NR == 0) exit
        if (NR % 2) printf "%.6f\n", a[(NR + 1) / 2]; else printf "%.6f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

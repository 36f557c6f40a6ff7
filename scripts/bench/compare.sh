# Shared by the GPU benches: compare() reads "name|label|unit|way" rows on
# stdin and prints, for each, the value dplua's side ($ours) and PyTorch's
# side ($theirs) printed for that name ("name value" or "name error: ...")
# and their ratio, the same way up for every row: above 1 is dplua ahead
# (way "lower": PyTorch's over dplua's; "higher": dplua's over PyTorch's).

# the value (or "error: ...") a side printed for a row name
value() { printf '%s\n' "$1" | awk -v n="$2" '$1 == n { sub(/^[^ ]+ /, ""); print; exit }'; }

compare() {
  printf '%-36s %-8s %10s %10s %8s\n' measurement unit dplua PyTorch ratio
  while IFS='|' read -r name label unit way; do
    a=$(value "$ours" "$name")
    b=$(value "$theirs" "$name")
    awk -v label="$label" -v unit="$unit" -v way="$way" -v a="$a" -v b="$b" 'BEGIN {
      num = "^[0-9]+([.][0-9]+)?$"
      if (a == "") a = "error: no result (the run stopped before this row)"
      if (b == "") b = "error: no result (the run stopped before this row)"
      if (a ~ num && b ~ num && a > 0 && b > 0) {
        printf "%-36s %-8s %10.1f %10.1f %7.2fx\n", label, unit, a, b, (way == "higher" ? a / b : b / a)
        exit
      }
      msg = ""
      if (a !~ num) { msg = "dplua " a; a = "-" } else a = sprintf("%.1f", a)
      if (b !~ num) { msg = msg (msg == "" ? "" : "; ") "PyTorch " b; b = "-" } else b = sprintf("%.1f", b)
      printf "%-36s %-8s %10s %10s   %s\n", label, unit, a, b, msg
    }'
  done
}

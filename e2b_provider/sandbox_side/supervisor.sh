# A background command's supervisor for a sandbox without python3, as the sandbox user (or
# as root, whose records are in root's home: /root/.capybara-cmd).
#
#   /bin/sh -c <this text> capybara-bg ID CTL SECONDS CAP WRAPPER COMMAND META...
#
# POSIX sh and GNU coreutils only. It does what supervisor.py does, and leaves the same
# record: the directory RECORDS/ID (mode 0700, in RECORDS, which must be this user's own
# and closed to others), the generation files stdout.<g> and stderr.<g> of CAP bytes each
# (byte n of a stream is in generation n / CAP; the two newest are kept), meta.json (META,
# in one or more arguments that are joined, is the JSON of what the library knows, without
# its closing brace: this adds started_at, pid and wrapper_pid, and never has to escape the
# command), and status.json, written whole once the command ended.
#
# The command runs exactly as supervisor.py runs it: setsid -w /bin/sh -c WRAPPER
# capybara-exec CTL COMMAND SECONDS, with CAPYBARA_EXEC=CTL in its environment alone, and
# alone holding the standard input envd gave this shell (so CloseStdin reaches it). Its
# output goes through two FIFOs to GNU split, whose filter writes each CAP bytes into the
# next generation file and removes the one before the last.
#
# On standard output it writes one frame, the ready frame (magic CB, kind r, offset 0, the
# length as 4 bytes, then meta.json), and nothing else: no live frames (followers read the
# record). What differs from supervisor.py: status.json's signal is null (a shell's wait
# gives 128+N both for a wrapper killed by signal N and for one that exited 128+N).
umask 077
records=/tmp/.capybara-cmd
root_records=/root/.capybara-cmd
dir=$records/$1
ctl=$2
secs=$3
cap=$4
wrapper=$5
cmd=$6
shift 6
# own PATH MODE: makes directory PATH if missing; whether it is now this user's own, not a
# link, its mode matching MODE (a case pattern of stat's %a)
own() {
  mkdir -- "$1" 2>/dev/null
  [ ! -L "$1" ] && [ -d "$1" ] && [ -O "$1" ] || return 1
  m=$(stat -c %a -- "$1") || return 1
  case $m in $2) return 0;; esac
  return 1
}
if [ "$(id -u)" = 0 ]; then
  # root's records: in root's home, which no other account may write to
  records=$root_records
  dir=$records/${dir##*/}
  own "${records%/*}" '?[0145][0145]' || records=
fi
if [ -z "$records" ] || ! own "$records" '*00'; then
  echo "capybara-bg: ${records:-$root_records} is not this user's own directory" >&2
  exit 90
fi
if ! split --filter=: /dev/null 2>/dev/null; then
  echo "capybara-bg: GNU split (coreutils) is needed to keep the output" >&2
  exit 92
fi
mkdir -- "$dir" && mkfifo -- "$dir/.stdout" "$dir/.stderr" || exit 91

# keep NAME: the stream's FIFO into its generation files (split's filter names each one
# from the number split gives it, removes what the sandbox user may have put there (a FIFO
# would hold the open), opens it, then removes the generation before the last)
keep() {
  SHELL=/bin/sh exec split -b "$cap" -d -a 12 --filter='f=${FILE##*/}; n=${f#.}; n=${n%.*}
g=$((1${f##*.} - 1000000000000)); o=${FILE%/*}/$n.$g
[ ! -e "$o" ] && [ ! -L "$o" ] || rm -f -- "$o"; exec 3>>"$o"
[ "$g" -lt 2 ] || rm -f -- "${FILE%/*}/$n.$((g - 2))"; exec cat >&3 3>&-' \
    - "$dir/.$1." <"$dir/.$1" >/dev/null 2>&1 3<&-
}

exec 3<&0 </dev/null
started=$(date +%s.%N)
keep stdout &
out_pid=$!
keep stderr &
err_pid=$!
CAPYBARA_EXEC=$ctl setsid -w /bin/sh -c "$wrapper" capybara-exec "$ctl" "$cmd" "$secs" \
  <&3 >"$dir/.stdout" 2>"$dir/.stderr" 3<&- &
w=$!
exec 3<&-
{
  printf '%s' "$@"
  printf ',"started_at":%s,"pid":%s,"wrapper_pid":%s}' "$started" "$$" "$w"
} >"$dir/.meta.json.$$" && mv -f -- "$dir/.meta.json.$$" "$dir/meta.json" || exit 91
n=$(wc -c <"$dir/meta.json")
printf "CBr\\000\\000\\000\\000\\000\\000\\000\\000$(printf '\\%03o' $((n >> 24 & 255)) \
  $((n >> 16 & 255)) $((n >> 8 & 255)) $((n & 255)))"
cat -- "$dir/meta.json"

# SIGTERM: the command's whole group is killed (its end is then recorded); SIGHUP is
# ignored (set after the command started, so it does not inherit that)
trap 'stopped=1; kill -9 -"$w" 2>/dev/null' TERM
trap '' HUP
while :; do
  stopped=
  wait "$w"
  code=$?
  [ -n "$stopped" ] && [ "$code" -gt 128 ] && kill -0 "$w" 2>/dev/null || break
done
# output still arriving (from processes that left the command's session) is kept for 2 s
(
  trap 'kill "$s" 2>/dev/null; exit 0' TERM
  sleep 2 & s=$!
  wait "$s" && kill "$out_pid" "$err_pid"
) </dev/null >/dev/null 2>&1 &
timer=$!
wait "$out_pid" "$err_pid"
kill "$timer" 2>/dev/null
ended=$(date +%s.%N)

# total NAME: the bytes the stream had (its newest generation's number times CAP, plus
# that generation's size)
total() {
  g=-1
  for f in "$dir/$1".*; do
    x=${f##*.}
    case $x in ''|*[!0-9]*|0?*) continue;; esac
    [ "$x" -le "$g" ] || g=$x
  done
  z=0
  [ "$g" -lt 0 ] || z=$(stat -c %s -- "$dir/$1.$g") || z=0
  echo $((g < 0 ? 0 : g * cap + z))
}

killed=false
[ ! -e "$dir/killed" ] || killed=true
timed_out=false
ns=$((${ended%.*}${ended#*.} - ${started%.*}${started#*.}))
if [ "$killed" = false ] && [ "$code" -eq 137 ] && [ "$secs" -gt 0 ] &&
  [ "$ns" -ge $(((secs - 1) * 1000000000)) ]; then
  timed_out=true
fi
t=$dir/.status.json.$$
[ ! -e "$t" ] && [ ! -L "$t" ] || rm -f -- "$t"
{
  printf '{"exit_code": %d, "signal": null, "timed_out": %s, "killed": %s, ' \
    "$code" "$timed_out" "$killed"
  printf '"ended_at": %s, "stdout_total": %d, "stderr_total": %d}' \
    "$ended" "$(total stdout)" "$(total stderr)"
} >"$t" && mv -f -T -- "$t" "$dir/status.json"
rm -f -- "$dir/.stdout" "$dir/.stderr"
exit 0

# Background commands' records, read without python3, as the sandbox user: what the file
# agent's cmd_read and cmd_list answer, for a sandbox that cannot run it.
#
#   /bin/sh -c <this text> capybara-cmd read ID OUT ERR MAX WAIT
#   /bin/sh -c <this text> capybara-cmd list
#
# POSIX sh and GNU coreutils, grep and sed. Records are as supervisor.py and supervisor.sh
# write them (RECORDS/ID: meta.json, status.json once ended, generation files stdout.<g> and
# stderr.<g> of CAP bytes each, the two newest kept).
#
# read: exit 3 when there is no such record. Else one line, "ALIVE META STATUS OF OT ON EF
# ET EN" (ALIVE 1 when the record's supervisor still runs; META and STATUS the lengths of
# meta.json and status.json that follow, 0 for no status; for stdout OF the stream offset of
# the bytes that follow, OT the bytes the stream has had, ON how many follow; then the same
# for stderr), then meta.json, status.json, ON bytes of stdout and EN bytes of stderr. OUT
# and ERR are the offsets to read from (-1: the last CAP bytes kept), at most MAX bytes of
# each. With WAIT > 0 it first waits (up to WAIT tenths of a second) until the command has
# output past OUT or ERR or has ended, so a follower asks again only when there is news.
# Every file is opened before anything is printed and read through that descriptor, so a
# generation removed meanwhile is still read whole.
#
# list: "LENGTH\n" then meta.json, for each record whose supervisor still runs.
export LC_ALL=C
records=/tmp/.capybara-cmd

# alive PID ID: whether process PID is the supervisor of record ID (a reused pid is not)
alive() {
  case $1 in ''|*[!0-9]*) return 1;; esac
  grep -qsxzF -e "$2" "/proc/$1/cmdline"
}

# pid META: the supervisor's pid in meta.json (as a key, never inside a string: a quote
# in a JSON string is escaped)
pid() {
  sed -n 's/.*[{,][[:space:]]*"pid"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' -- "$1" \
    2>/dev/null | head -n 1
}

# gens NAME: A and B, the two newest generations of stream NAME in $d (-1: none)
gens() {
  A=-1
  B=-1
  for gf in "$d/$1".*; do
    gn=${gf##*.}
    case $gn in ''|*[!0-9]*|0?*) continue;; esac
    if [ "$gn" -gt "$B" ]; then A=$B; B=$gn; elif [ "$gn" -gt "$A" ]; then A=$gn; fi
  done
}

# stream NAME FD-A FD-B OFFSET: opens the stream's two newest generations on the
# descriptors and sets F (the first offset kept), T (the bytes written), S (where to read
# from), N (how many bytes to read), GA and GB (the generations open, -1: none)
stream() {
  k=0
  while [ $k -lt 5 ]; do
    k=$((k + 1))
    gens "$1"
    [ "$A" -eq $((B - 1)) ] || A=-1
    GA=$A
    GB=$B
    F=0 T=0 S=0 N=0
    [ "$B" -ge 0 ] || return 0
    if [ "$A" -ge 0 ]; then
      eval "command exec $2<\"\$d/\$1.\$A\"" 2>/dev/null || continue
    fi
    eval "command exec $3<\"\$d/\$1.\$B\"" 2>/dev/null || continue
    z=$(stat -L -c %s "/proc/self/fd/$3") || continue
    T=$((B * c + z))
    F=$(((A < 0 ? B : A) * c))
    if [ "$4" -lt 0 ]; then S=$((T - c)); else S=$4; fi
    [ "$S" -ge "$F" ] || S=$F
    N=$((T - S))
    [ "$N" -le "$m" ] || N=$m
    [ "$N" -ge 0 ] || N=0
    return 0
  done
  echo "capybara-cmd: the record changed while it was read" >&2
  exit 1
}

# dump FD-A FD-B GA GB S N: N bytes of the stream from offset S
dump() {
  p=$5
  q=$6
  while [ "$q" -gt 0 ]; do
    g=$((p / c))
    if [ "$g" -eq "$3" ]; then h=$1; elif [ "$g" -eq "$4" ]; then h=$2; else break; fi
    l=$(((g + 1) * c - p))
    [ "$l" -le "$q" ] || l=$q
    dd if="/proc/self/fd/$h" bs=65536 iflag=skip_bytes,count_bytes skip=$((p - g * c)) \
      count="$l" status=none || exit 1
    p=$((p + l))
    q=$((q - l))
  done
}

# total NAME: sets T to the bytes stream NAME has had
total() {
  gens "$1"
  T=0
  [ "$B" -ge 0 ] || return 0
  z=$(stat -c %s -- "$d/$1.$B" 2>/dev/null) || z=0
  T=$((B * c + z))
}

if [ "$1" = list ]; then
  for d in "$records"/*; do
    id=${d##*/}
    case $id in *[!0-9a-f]*) continue;; esac
    [ ${#id} -eq 32 ] && [ ! -e "$d/status.json" ] && [ -f "$d/meta.json" ] || continue
    alive "$(pid "$d/meta.json")" "$id" || continue
    command exec 5<"$d/meta.json" 2>/dev/null || continue
    z=$(stat -L -c %s /proc/self/fd/5) && [ "$z" -le 1048576 ] || continue
    echo "$z"
    head -c "$z" /proc/self/fd/5
  done
  exit 0
fi

id=$2
case $id in *[!0-9a-f]*) exit 3;; esac
[ ${#id} -eq 32 ] || exit 3
d=$records/$id
[ -f "$d/meta.json" ] || exit 3
command exec 5<"$d/meta.json" 2>/dev/null || exit 3
ml=$(stat -L -c %s /proc/self/fd/5) && [ "$ml" -le 1048576 ] || exit 3
c=$(sed -n 's/.*[{,][[:space:]]*"cap"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' \
  /proc/self/fd/5 | head -n 1)
[ -n "$c" ] || c=1048576
[ "$c" -ge 1 ] || c=1048576
m=$5
P=$(pid /proc/self/fd/5)
if [ "$3" -ge 0 ] && [ "$4" -ge 0 ] && [ ! -e "$d/status.json" ] && alive "$P" "$id"; then
  i=0
  while [ "$i" -lt "$6" ] && [ ! -e "$d/status.json" ]; do
    total stdout
    [ "$T" -le "$3" ] || break
    total stderr
    [ "$T" -le "$4" ] || break
    sleep 0.1
    i=$((i + 1))
  done
fi
# whether it runs, then whether it ended (in this order: a supervisor writes its status
# before it exits, so one found gone without a status never wrote one)
v=0
! alive "$P" "$id" || v=1
sl=0
if [ -f "$d/status.json" ] && command exec 6<"$d/status.json" 2>/dev/null; then
  sl=$(stat -L -c %s /proc/self/fd/6) && [ "$sl" -le 1048576 ] || sl=0
  v=0
fi
stream stdout 3 4 "$3"
of=$S ot=$T on=$N oa=$GA ob=$GB
stream stderr 7 8 "$4"
echo "$v $ml $sl $of $ot $on $S $T $N"
head -c "$ml" /proc/self/fd/5
[ "$sl" -eq 0 ] || head -c "$sl" /proc/self/fd/6
dump 3 4 "$oa" "$ob" "$of" "$on"
dump 7 8 "$GA" "$GB" "$S" "$N"
exit 0

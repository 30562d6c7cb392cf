# Background commands' records, read without python3, as the sandbox user: what the file
# agent's cmd_read and cmd_list answer, for a sandbox that cannot run it. As root, it reads
# root's records (/root/.capybara-cmd), which the file agent, the sandbox user's, may not.
#
#   /bin/sh -c <this text> capybara-cmd read ID OUT ERR MAX WAIT
#   /bin/sh -c <this text> capybara-cmd list
#
# POSIX sh and GNU coreutils, grep and sed. Records are as supervisor.py and supervisor.sh
# write them (RECORDS/ID: meta.json, status.json once ended, generation files stdout.<g> and
# stderr.<g> of CAP bytes each, the two newest kept).
#
# read: exit 3 when there is no such record, 4 when a file of it is not a regular file (a
# FIFO, a link, a device: the sandbox user can put anything in a record; standard error
# names the file). Else one line, "ALIVE META STATUS OF OT ON EF
# ET EN" (ALIVE 1 when the record's supervisor still runs; META and STATUS the lengths of
# meta.json and status.json that follow, 0 for no status; for stdout OF the stream offset of
# the bytes that follow, OT the bytes the stream has had, ON how many follow; then the same
# for stderr), then meta.json, status.json, ON bytes of stdout and EN bytes of stderr. OUT
# and ERR are the offsets to read from (-1: the last CAP bytes kept), at most MAX bytes of
# each. With WAIT > 0 it first waits (up to WAIT tenths of a second) until the command has
# output past OUT or ERR or has ended, so a follower asks again only when there is news.
# Every file is opened before anything is printed and read through that descriptor, so a
# generation removed meanwhile is still read whole; each is opened only if it is a regular
# file, and never waits (see reg). A read starts few processes (sed, grep,
# stat, cat, and a dd per generation it reads from): each costs about a millisecond.
#
# list: "LENGTH\n" then meta.json, for each record whose supervisor still runs; a record
# whose meta.json is not a regular file is left out (and named on standard error).
export LC_ALL=C
records=/tmp/.capybara-cmd
root_records=/root/.capybara-cmd
[ "$(id -u)" != 0 ] || records=$root_records

# alive PID ID: whether process PID is the supervisor of record ID (a reused pid is not)
alive() {
  case $1 in ''|*[!0-9]*) return 1;; esac
  grep -qsxzF -e "$2" "/proc/$1/cmdline"
}

# reg FD PATH: opens PATH on descriptor FD if it is a regular file (not a link, not a FIFO,
# not a device), looked at by name before the open and through the descriptor after it. It
# is opened for reading and writing (never written), which does not wait for a FIFO's
# writer: a FIFO swapped in between never holds the script. Such an open makes a file that
# is missing: meta.json and status.json are only ever replaced whole, never removed; a
# generation file removed meanwhile is found by stray. Returns 1 when there is no such
# file, 2 when it is not a regular file (said on standard error, as the file agent says
# it).
reg() {
  if [ -L "$2" ]; then
    echo "capybara-cmd: ${2##*/} is a symbolic link" >&2
    return 2
  elif [ -p "$2" ]; then
    echo "capybara-cmd: ${2##*/} is a FIFO, not a regular file" >&2
    return 2
  elif [ -e "$2" ] && [ ! -f "$2" ]; then
    echo "capybara-cmd: ${2##*/} is not a regular file" >&2
    return 2
  fi
  [ -f "$2" ] || return 1
  eval "command exec $1<>\"\$2\"" 2>/dev/null || return 1
  [ ! -f "/proc/self/fd/$1" ] || return 0
  eval "command exec $1<&-"
  echo "capybara-cmd: ${2##*/} is not a regular file" >&2
  return 2
}

# keys META: sets P (the supervisor's pid) and C (the cap) from meta.json, each as a key,
# never inside a string (a quote in a JSON string is escaped), digits only
keys() {
  P=
  C=
  eval "$(sed -n -e h \
    -e 's/.*[{,][[:space:]]*"pid"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/P=\1/p' -e g \
    -e 's/.*[{,][[:space:]]*"cap"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/C=\1/p' \
    -- "$1" 2>/dev/null)"
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

# news: whether either stream has had more than $from_out / $from_err bytes (a failed look
# counts as news: the caller reads what there is)
news() {
  gens stdout
  nb=$B
  gens stderr
  eb=$B
  set --
  [ "$nb" -lt 0 ] || set -- "$d/stdout.$nb"
  [ "$eb" -lt 0 ] || set -- "$@" "$d/stderr.$eb"
  [ $# -gt 0 ] || return 1
  z=$(stat -c %s -- "$@" 2>/dev/null) || return 0
  set -- $z
  if [ "$nb" -ge 0 ]; then [ $((nb * cap + $1)) -le "$from_out" ] || return 0; shift; fi
  [ "$eb" -ge 0 ] && [ $((eb * cap + $1)) -gt "$from_err" ]
}

# stray FD PATH NEWER: whether generation file PATH, open on FD, is one the open made (the
# generation was removed before it: it is empty, and NEWER, the generation two after it,
# whose making removes it, exists); that file is closed and removed again
stray() {
  [ ! -s "/proc/self/fd/$1" ] && [ -e "$3" ] || return 1
  eval "command exec $1<&-"
  [ -s "$2" ] || rm -f -- "$2"
}

# open NAME FD-A FD-B: opens the stream's two newest generations (consecutive ones) on the
# descriptors; sets A and B to their numbers (-1: none)
open() {
  k=0
  while [ $k -lt 5 ]; do
    k=$((k + 1))
    gens "$1"
    [ "$A" -eq $((B - 1)) ] || A=-1
    [ "$B" -ge 0 ] || return 0
    if [ "$A" -ge 0 ]; then
      reg "$2" "$d/$1.$A"
      case $? in 0) ;; 2) exit 4;; *) continue;; esac
      ! stray "$2" "$d/$1.$A" "$d/$1.$((A + 2))" || continue
    fi
    reg "$3" "$d/$1.$B"
    case $? in 0) ;; 2) exit 4;; *) continue;; esac
    stray "$3" "$d/$1.$B" "$d/$1.$((B + 2))" || return 0
  done
  echo "capybara-cmd: the record changed while it was read" >&2
  exit 1
}

# span A B SIZE OFFSET: sets F (the first offset kept), T (the bytes written), S (where to
# read from) and N (how many bytes, at most $limit) of a stream whose newest generation B
# has SIZE bytes
span() {
  F=0 T=0 S=0 N=0
  [ "$2" -ge 0 ] || return 0
  T=$(($2 * cap + $3))
  F=$((($1 < 0 ? $2 : $1) * cap))
  if [ "$4" -lt 0 ]; then S=$((T - cap)); else S=$4; fi
  [ "$S" -ge "$F" ] || S=$F
  N=$((T - S))
  [ "$N" -le "$limit" ] || N=$limit
  [ "$N" -ge 0 ] || N=0
}

# dump FD-A FD-B A B S N: N bytes of the stream from offset S
dump() {
  p=$5
  q=$6
  while [ "$q" -gt 0 ]; do
    g=$((p / cap))
    if [ "$g" -eq "$3" ]; then h=$1; elif [ "$g" -eq "$4" ]; then h=$2; else exit 1; fi
    l=$(((g + 1) * cap - p))
    [ "$l" -le "$q" ] || l=$q
    dd if="/proc/self/fd/$h" bs=65536 iflag=skip_bytes,count_bytes skip=$((p - g * cap)) \
      count="$l" status=none || exit 1
    p=$((p + l))
    q=$((q - l))
  done
}

if [ "$1" = list ]; then
  for d in "$records"/*; do
    id=${d##*/}
    case $id in *[!0-9a-f]*) continue;; esac
    [ ${#id} -eq 32 ] && [ ! -e "$d/status.json" ] && [ ! -L "$d/status.json" ] || continue
    reg 5 "$d/meta.json" 2>/dev/null
    case $? in 0) ;; 2) echo "capybara-cmd: record $id: meta.json is not a regular file" >&2
      continue;; *) continue;; esac
    keys /proc/self/fd/5
    alive "$P" "$id" || continue
    z=$(stat -L -c %s /proc/self/fd/5) && [ "$z" -le 1048576 ] || continue
    echo "$z"
    cat /proc/self/fd/5
  done
  exit 0
fi

id=$2
case $id in *[!0-9a-f]*) exit 3;; esac
[ ${#id} -eq 32 ] || exit 3
d=$records/$id
from_out=$3
from_err=$4
limit=$5
reg 5 "$d/meta.json"
case $? in 0) ;; 2) exit 4;; *) exit 3;; esac
keys /proc/self/fd/5
cap=$C
[ -n "$cap" ] && [ "$cap" -ge 1 ] && [ "$cap" -le 1073741824 ] 2>/dev/null || cap=1048576
if [ "$from_out" -ge 0 ] && [ "$from_err" -ge 0 ] && [ ! -e "$d/status.json" ] &&
  alive "$P" "$id"; then
  i=0
  while [ "$i" -lt "$6" ] && [ ! -e "$d/status.json" ] && ! news; do
    sleep 0.1
    i=$((i + 1))
  done
fi
# whether it runs, then whether it ended (in this order: a supervisor writes its status
# before it exits, so one found gone without a status never wrote one)
v=0
! alive "$P" "$id" || v=1
st=0
reg 6 "$d/status.json"
case $? in 0) st=1 v=0;; 2) exit 4;; esac
open stdout 3 4
oa=$A ob=$B
open stderr 7 8
ea=$A eb=$B
# one stat for every size: meta.json, status.json, each stream's newest generation
set -- /proc/self/fd/5
[ "$st" = 0 ] || set -- "$@" /proc/self/fd/6
[ "$ob" -lt 0 ] || set -- "$@" /proc/self/fd/4
[ "$eb" -lt 0 ] || set -- "$@" /proc/self/fd/8
z=$(stat -L -c %s -- "$@") || exit 1
set -- $z
ml=$1
shift
[ "$ml" -le 1048576 ] || exit 3
sl=0
if [ "$st" = 1 ]; then sl=$1; shift; fi
[ "$sl" -le 1048576 ] || sl=0
zo=0
if [ "$ob" -ge 0 ]; then zo=$1; shift; fi
ze=${1:-0}
span "$oa" "$ob" "$zo" "$from_out"
of=$S ot=$T on=$N
span "$ea" "$eb" "$ze" "$from_err"
echo "$v $ml $sl $of $ot $on $S $T $N"
if [ "$sl" -gt 0 ]; then cat /proc/self/fd/5 /proc/self/fd/6; else cat /proc/self/fd/5; fi
dump 3 4 "$oa" "$ob" "$of" "$on"
dump 7 8 "$ea" "$eb" "$S" "$N"
exit 0

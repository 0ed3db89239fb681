#!/usr/bin/env bash
# Builds the logging libcuda.so.1 of export_log.c into DIR: trampolines for
# every symbol NVIDIA's driver exports (but the three export_log.c defines)
# and a wrapper per (table, slot). Then run a program natively with
#   REAL_LIBCUDA=$(cat DIR/real) EXPORT_LOG=FILE LD_LIBRARY_PATH=DIR program
#
#   bench/h100/probes/export_log.sh DIR
set -eu
DIR=$1
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$DIR"
REAL=$(readlink -f "$(ldconfig -p | awk '/libcuda\.so\.1 / && /x86-64/ { print $NF; exit }')")
echo "$REAL" >"$DIR/real"
nm -D --defined-only "$REAL" | awk '$2 == "T" { print $3 }' | sed 's/@.*//' | sort -u |
    grep -v -x -E 'cuGetExportTable|cuGetProcAddress|cuGetProcAddress_v2' >"$DIR/names"
{
    echo '.text'
    i=0
    while read -r n; do
        printf '.globl %s\n.type %s,@function\n%s: jmp *shim_real+%d(%%rip)\n' "$n" "$n" "$n" $((i * 8))
        i=$((i + 1))
    done <"$DIR/names"
    echo '.section .note.GNU-stack,"",@progbits'
} >"$DIR/trampolines.S"
{
    echo 'const char *const shim_names[] = {'
    sed 's/.*/"&",/' "$DIR/names"
    echo '};'
    echo "const int shim_count = $(wc -l <"$DIR/names");"
} >"$DIR/names.c"
{
    for t in $(seq 0 47); do
        for s in $(seq 0 127); do
            echo "static uint64_t w_${t}_$s(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e, uint64_t f) { return logged_call($t, $s, a, b, c, d, e, f); }"
        done
    done
    echo 'static void *const wrappers[48][128] = {'
    for t in $(seq 0 47); do
        printf '{'
        for s in $(seq 0 127); do printf 'w_%d_%d,' "$t" "$s"; done
        echo '},'
    done
    echo '};'
} >"$DIR/export_log_wrappers.h"
cc -O1 -shared -fPIC -Wl,-soname,libcuda.so.1 -I"$DIR" -o "$DIR/libcuda.so.1" \
    "$HERE/export_log.c" "$DIR/names.c" "$DIR/trampolines.S" -ldl -lpthread
echo "export_log: $(wc -l <"$DIR/names") symbols forwarded to $REAL"

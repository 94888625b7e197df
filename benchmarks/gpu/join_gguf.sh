# Sourced by benchmarks/gpu/run.sh and benchmarks/distill/gpu_instruct.sh: the GGUF carried to a
# machine without network in parts (each command there carries at most 64 MiB).
# join_gguf_parts DIR: joins DIR/*.part* into /tmp/<name>, checks it against DIR/*.sha256 when
# present, and prints the joined file's path; returns 2 when the parts do not join.
join_gguf_parts() {
  local parts=$1 name joined sums
  name=$(basename "$(ls "$parts"/*.part* | head -1)" | sed 's/\.part.*//')
  joined=/tmp/$name
  cat $(ls "$parts"/*.part* | sort) > "$joined" || return 2
  if ls "$parts"/*.sha256 >/dev/null 2>&1; then
    sums=$(realpath "$(ls "$parts"/*.sha256 | head -1)")
    (cd /tmp && sha256sum -c "$sums" >&2) || { echo "GGUF parts do not join to the recorded file" >&2; return 2; }
  fi
  echo "$joined"
}

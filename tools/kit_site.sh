# Sourced by the GPU-machine tools: the gpu-kit's package directory (KIT_SITE, default
# /tmp/site, where the kit's load.sh unpacks) goes on PYTHONPATH only if this user owns it and
# no one else can write it; on a shared host anyone could create /tmp/site first and run code
# in every benchmark and server these tools start.
kit_site_check() {
  local site="${KIT_SITE:-/tmp/site}" mode
  [ -d "$site" ] || { echo "kit_site: $site does not exist (load the gpu-kit first)" >&2; return 1; }
  if [ ! -O "$site" ]; then
    echo "kit_site: $site is not owned by $(id -un); refusing to put it on PYTHONPATH" >&2
    return 1
  fi
  mode=$(stat -c %a "$site")
  if (( 8#$mode & 8#022 )); then
    echo "kit_site: $site is writable by others (mode $mode); refusing to put it on PYTHONPATH (if you unpacked it, chmod go-w $site)" >&2
    return 1
  fi
  KIT_SITE="$site"
}

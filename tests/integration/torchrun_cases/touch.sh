#!/bin/bash
# A rank of the matrix run with --no-python: <dir>/<RANK> with the variables it sees.
echo "creating $RANK"
echo "stderr of $RANK" >&2
for n in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK \
         ROLE_WORLD_SIZE ROLE_NAME MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID \
         TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS TEST_SENTINEL_PARENT; do
    if [ -n "${!n+x}" ]; then echo "$n=${!n}"; fi
done > "$1/$RANK"

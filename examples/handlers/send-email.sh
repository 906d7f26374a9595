#!/bin/sh
# Example command handler: reads the job payload (JSON) on stdin.
# Exit 0 = done; exit 75 = permanent failure (dead letter); anything else = retry.
payload=$(cat)
case "$payload" in
  *'"to":"bounce@'*) echo "mailbox does not exist" >&2; exit 75 ;;
  *'"flaky":true'*)  [ "${QBRIDGE_ATTEMPT:-1}" -ge 2 ] || { echo "smtp timeout" >&2; exit 1; } ;;
esac
exit 0

#!/usr/bin/env bash
# Fetches Apache Kafka (broker, KRaft storage tool, consumer-groups tool) and its runtime jars from
# Maven Central into the cache directory. Idempotent: returns at once when the jars are there.
# Prints the jar directory. Usage: scripts/kafka/fetch.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${ZEROSCALE_KAFKA_CACHE:-$HOME/.cache/zeroscale-kafka}"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
jars="$cache/kafka-$version/libs"
# The stamp holds the pom's checksum, so editing the pom fetches again.
stamp="$jars/.complete"
sum="$(sha256sum "$here/pom.xml" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ]; then
  echo "$jars"
  exit 0
fi
command -v mvn >/dev/null || { echo "fetch.sh: Maven (mvn) is missing; run scripts/setup-system.sh" >&2; exit 1; }
rm -rf "$jars.tmp"
mkdir -p "$cache"
if ! mvn -q -B -Dstyle.color=never -f "$here/pom.xml" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$jars.tmp" >"$cache/fetch.log" 2>&1; then
  cat "$cache/fetch.log" >&2
  echo "fetch.sh: Maven could not fetch Apache Kafka $version (log above)" >&2
  exit 1
fi
rm -rf "$jars"
mv "$jars.tmp" "$jars"
echo "$sum" >"$stamp"
echo "$jars"

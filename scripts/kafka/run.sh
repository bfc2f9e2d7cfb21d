#!/usr/bin/env bash
# Runs one Apache Kafka broker in KRaft mode (broker and controller in one process) on loopback,
# in the foreground, until it gets SIGTERM. Used by the tests, the benchmark and the demo.
#
# Usage: scripts/kafka/run.sh STATE_DIR PLAINTEXT_PORT SASL_PORT CONTROLLER_PORT [TLS_PORT]
#   STATE_DIR        holds server.properties, the log config and the data; formatted on first use,
#                    reused on a restart (so topics, offsets and users survive it)
#   SASL_PORT        a SASL_PLAINTEXT listener taking SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN
#   TLS_PORT         optional: an SSL listener that requires a client certificate; needs
#                    KAFKA_TLS_DIR holding server.pem (PKCS#8 key + certificate chain) and ca.pem
# Environment: KAFKA_USER / KAFKA_PASSWORD, the one user of the SASL listener (created at format
# time, for both SCRAM mechanisms and PLAIN); defaults zeroscale / zeroscale-secret (test only).
set -euo pipefail
[ $# -eq 4 ] || [ $# -eq 5 ] || { sed -n '4,12p' "$0" >&2; exit 2; }
dir="$(mkdir -p "$1" && cd "$1" && pwd)"
port="$2" sasl_port="$3" controller_port="$4" tls_port="${5:-}"
user="${KAFKA_USER:-zeroscale}" password="${KAFKA_PASSWORD:-zeroscale-secret}"
jars="$("$(dirname "$0")/fetch.sh")"

cat >"$dir/log4j2.properties" <<LOG
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = out
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
LOG

listeners="PLAINTEXT://127.0.0.1:$port,SASL_PLAINTEXT://127.0.0.1:$sasl_port"
protocols="PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
tls_properties=""
if [ -n "$tls_port" ]; then
  tls="$(cd "${KAFKA_TLS_DIR:?KAFKA_TLS_DIR must name the directory of server.pem and ca.pem}" && pwd)"
  listeners="$listeners,SSL://127.0.0.1:$tls_port"
  protocols="$protocols,SSL:SSL"
  tls_properties="listener.name.ssl.ssl.keystore.type=PEM
listener.name.ssl.ssl.keystore.location=$tls/server.pem
listener.name.ssl.ssl.truststore.type=PEM
listener.name.ssl.ssl.truststore.location=$tls/ca.pem
listener.name.ssl.ssl.client.auth=required"
fi

cat >"$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$controller_port
controller.listener.names=CONTROLLER
listeners=$listeners,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=$listeners
listener.security.protocol.map=$protocols
inter.broker.listener.name=PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$user="$password";
log.dirs=$dir/data
num.partitions=1
auto.create.topics.enable=false
# One broker: every internal topic has one replica; few offset partitions keep start-up quick.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# Retention is applied every second from the first, so a topic with a short retention.ms shows it quickly.
log.initial.task.delay.ms=1000
log.retention.check.interval.ms=1000
$tls_properties
PROPS

java_opts=(-Xms256m -Xmx768m -XX:+UseSerialGC -Djava.awt.headless=true
  "-Dlog4j2.configurationFile=$dir/log4j2.properties")
if [ ! -f "$dir/data/meta.properties" ]; then
  # A base64url id that starts with "-" would be read by the tool as an option (and the id as missing).
  cluster_id="-"
  while [ "${cluster_id#-}" != "$cluster_id" ]; do
    cluster_id="$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
  done
  java "${java_opts[@]}" -XX:TieredStopAtLevel=1 -cp "$jars/*" kafka.tools.StorageTool format \
    --config "$dir/server.properties" --cluster-id "$cluster_id" --standalone --ignore-formatted \
    --add-scram "SCRAM-SHA-256=[name=$user,password=$password]" \
    --add-scram "SCRAM-SHA-512=[name=$user,password=$password]" >/dev/null
fi
exec java "${java_opts[@]}" -cp "$jars/*" kafka.Kafka "$dir/server.properties"

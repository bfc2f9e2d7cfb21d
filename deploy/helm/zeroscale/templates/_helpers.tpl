{{/* The prefix of every object's name; cluster-scoped objects carry it too, so two releases never collide. */}}
{{- define "zeroscale.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object; kustomize's deploy/base carries the first one too. */}}
{{- define "zeroscale.labels" -}}
app.kubernetes.io/part-of: zeroscale
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector of one component's pods: ctx = (list $ "adapter"|"proxy"). */}}
{{- define "zeroscale.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: zeroscale-{{ index . 1 }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
{{- end -}}

{{- define "zeroscale.componentLabels" -}}
{{ include "zeroscale.labels" (index . 0) }}
{{ include "zeroscale.selector" . }}
{{- end -}}

{{- define "zeroscale.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The Secret holding each component's certificate, key and the installation's CA (ca.crt). */}}
{{- define "zeroscale.secretName" -}}
{{- $root := index . 0 -}}{{- $component := index . 1 -}}
{{- $mode := $root.Values.certificates.mode -}}
{{- if eq $mode "secret" -}}
{{- $name := index $root.Values.certificates.secret $component -}}
{{- required (printf "certificates.secret.%s: the name of the %s's Secret (certificates.mode is secret)" $component $component) $name -}}
{{- else if eq $component "adapter" -}}
{{- include "zeroscale.fullname" $root }}-adapter-serving
{{- else -}}
{{- include "zeroscale.fullname" $root }}-proxy-counts
{{- end -}}
{{- end -}}

{{/* DNS names the certificates are issued for: ctx = (list $ "adapter"|"proxy"). */}}
{{- define "zeroscale.dnsNames" -}}
{{- $root := index . 0 -}}
{{- $service := ternary (printf "%s-adapter" (include "zeroscale.fullname" $root)) (printf "%s-proxy-counts" (include "zeroscale.fullname" $root)) (eq (index . 1) "adapter") -}}
{{- $ns := $root.Release.Namespace -}}
{{- $names := list (printf "%s.%s.svc" $service $ns) (printf "%s.%s.svc.cluster.local" $service $ns) -}}
{{- if eq (index . 1) "adapter" }}{{ $names = concat $names (list (printf "%s.%s" $service $ns) $service) }}{{ end -}}
{{- toJson $names -}}
{{- end -}}

{{/* The containers' security context, and the pods': what the "restricted" Pod Security level admits. */}}
{{- define "zeroscale.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile: {type: RuntimeDefault}
{{- end -}}
{{- define "zeroscale.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: ["ALL"]}
{{- end -}}

{{/* Pods of a component prefer different nodes: ctx = (list $ "adapter"|"proxy"). */}}
{{- define "zeroscale.antiAffinity" -}}
podAntiAffinity:
  # Preferred, not required: a one-node cluster still runs both replicas.
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "zeroscale.selector" . | nindent 12 }}
{{- end -}}

{{/*
The generated PKI (certificates.mode generate), computed once per render and shared by every template that
needs it: the CA and each leaf are taken from the cluster when they exist (so upgrades keep them, and the
APIService's caBundle never changes), a leaf is issued anew from the same CA when it is missing, was made by
another CA, or expires within certificates.generate.renewDays. Returns JSON: {ca, adapter, proxy, keda} each
{crt, key, notAfter} (PEM; notAfter in Unix seconds).
*/}}
{{- define "zeroscale.pki" -}}
{{- if not (hasKey .Values "_generatedPKI") -}}
{{- $ns := .Release.Namespace -}}
{{- $fullname := include "zeroscale.fullname" . -}}
{{- $gen := .Values.certificates.generate -}}
{{- $pki := dict -}}
{{- $caSecret := lookup "v1" "Secret" $ns (printf "%s-ca" $fullname) -}}
{{- $ca := "" -}}
{{- if and $caSecret (index ($caSecret.data | default dict) "tls.crt") (index ($caSecret.data | default dict) "tls.key") -}}
{{- $ca = buildCustomCert (index $caSecret.data "tls.crt") (index $caSecret.data "tls.key") -}}
{{- $_ := set $pki "ca" (dict "crt" $ca.Cert "key" $ca.Key "notAfter" (index ($caSecret.metadata.annotations | default dict) "zeroscale.io/not-after" | default "0")) -}}
{{- else -}}
{{- $ca = genCA (printf "%s-ca" $fullname) (int $gen.caDays) -}}
{{- $_ := set $pki "ca" (dict "crt" $ca.Cert "key" $ca.Key "notAfter" (add (now | unixEpoch) (mul $gen.caDays 86400) | toString)) -}}
{{- end -}}
{{- $renewBy := add (now | unixEpoch) (mul $gen.renewDays 86400) -}}
{{- range $component := list "adapter" "proxy" "keda" -}}
{{- $name := printf "%s-%s" $fullname (get (dict "adapter" "adapter-serving" "proxy" "proxy-counts" "keda" "keda-client") $component) -}}
{{- $existing := lookup "v1" "Secret" $ns $name -}}
{{- $data := $existing.data | default dict -}}
{{- $notAfter := index (($existing.metadata | default dict).annotations | default dict) "zeroscale.io/not-after" | default "0" -}}
{{- if and (index $data "tls.crt") (index $data "tls.key") (eq (index $data "ca.crt" | default "" | b64dec) $ca.Cert) (gt (atoi $notAfter) (int64 $renewBy)) -}}
{{- $_ := set $pki $component (dict "crt" (index $data "tls.crt" | b64dec) "key" (index $data "tls.key" | b64dec) "notAfter" $notAfter) -}}
{{- else -}}
{{- $dnsNames := list "keda" -}}{{/* the name grpc.scaler.tls.client_names admits */}}
{{- if ne $component "keda" }}{{ $dnsNames = include "zeroscale.dnsNames" (list $ $component) | fromJsonArray }}{{ end -}}
{{- $cn := first $dnsNames -}}
{{- $leaf := genSignedCert $cn nil $dnsNames (int $gen.days) $ca -}}
{{- $_ := set $pki $component (dict "crt" $leaf.Cert "key" $leaf.Key "notAfter" (add (now | unixEpoch) (mul $gen.days 86400) | toString)) -}}
{{- end -}}
{{- end -}}
{{- $_ := set .Values "_generatedPKI" $pki -}}
{{- end -}}
{{- toJson .Values._generatedPKI -}}
{{- end -}}

{{/* The APIService's caBundle (base64) for modes generate and secret; cert-manager injects its own. */}}
{{- define "zeroscale.caBundle" -}}
{{- $mode := .Values.certificates.mode -}}
{{- if eq $mode "generate" -}}
{{- (include "zeroscale.pki" . | fromJson).ca.crt | b64enc -}}
{{- else if eq $mode "secret" -}}
{{- if .Values.certificates.secret.caBundle -}}
{{- .Values.certificates.secret.caBundle -}}
{{- else -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "zeroscale.secretName" (list . "adapter")) -}}
{{- $ca := index (($secret | default dict).data | default dict) "ca.crt" -}}
{{- required (printf "certificates.secret.caBundle is empty and Secret %s/%s has no ca.crt (or `helm template` cannot read it): set certificates.secret.caBundle to the base64 PEM of the CA" .Release.Namespace (include "zeroscale.secretName" (list . "adapter"))) $ca -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Mode activator, per namespace of an activator route's Service (config.proxy.routes): the Services clients call and
the target workloads there by plural, each sorted. JSON: {namespace: {services: [...], workloads: {plural: [...]}}};
{} when no route is in mode activator. With route objects and config.proxy.route_objects.activator_ports, every
namespace of config.proxy.route_objects.namespaces too, with "any": true (a team names its Services and workloads
as it likes, so the Role cannot name them). The proxy's Roles (rbac.yaml) and NOTES.txt read it.
*/}}
{{- define "zeroscale.activatorGrants" -}}
{{- include "zeroscale.fillConfig" . -}}
{{- $activator := dict -}}
{{- $objects := dig "proxy" "route_objects" dict .Values.config -}}
{{- if and (include "zeroscale.routeObjects" .) $objects.activator_ports -}}
{{- if not $objects.namespaces -}}
{{- fail "config.proxy.route_objects.activator_ports: route objects in mode activator write their Services' EndpointSlices, which redirects Services, so the chart grants it only in the namespaces listed in config.proxy.route_objects.namespaces (none listed: list them, or remove activator_ports)" -}}
{{- end -}}
{{- range $namespace := $objects.namespaces -}}
{{- $_ := set $activator $namespace (dict "services" (list) "workloads" (dict) "any" true) -}}
{{- end -}}
{{- end -}}
{{- range (dig "proxy" "routes" (list) .Values.config) -}}
{{- if .activator -}}
{{- $namespace := required "a route in mode activator needs a Service upstream (service, namespace)" .upstream.namespace -}}
{{- $grants := get $activator $namespace | default (dict "services" (list) "workloads" (dict)) -}}
{{- $_ := set $grants "services" (append $grants.services .activator.service | uniq | sortAlpha) -}}
{{- $plural := get (dict "Deployment" "deployments" "StatefulSet" "statefulsets" "ReplicaSet" "replicasets") (.target.kind | default "Deployment") -}}
{{- $_ := set $grants.workloads $plural (append (get $grants.workloads $plural | default (list)) .target.name | uniq | sortAlpha) -}}
{{- $_ := set $activator $namespace $grants -}}
{{- end -}}
{{- end -}}
{{- toJson $activator -}}
{{- end -}}

{{/*
Mode activator's Lease name, as the proxy elects on it (adapter/config/proxy.py, ActivatorConfig.lease(): one owner,
this copy checked against it by tests/deploy/test_rbac.py): lease_name, or `<proxy_service.service>-activator`,
prefixed with `<proxy_service.namespace>.` when that is not lease_namespace. The Role grants get and update on it
alone.
*/}}
{{- define "zeroscale.activatorLease" -}}
{{- include "zeroscale.fillConfig" . -}}
{{- $settings := dig "proxy" "activator" dict .Values.config -}}
{{- $service := $settings.proxy_service | default dict -}}
{{- $namespace := $settings.lease_namespace | default .Release.Namespace -}}
{{- $prefix := ternary "" (printf "%s." $service.namespace) (eq ($service.namespace | default "") $namespace) -}}
{{- $settings.lease_name | default (printf "%s%s-activator" $prefix (required "config.proxy.activator.proxy_service.service: a route in mode activator needs the proxy's Service" $service.service)) -}}
{{- end -}}

{{/*
What the release fills into values `config` (in place, once per render; include it before reading .Values.config):
with routeObjects.enabled and the proxy enabled in cluster mode, config.proxy.route_objects.enabled (unless the config
sets it) and, when route objects are on, config.proxy.activator's proxy_service (this release's proxy Service) and
lease_namespace (the release namespace) when unset: route_objects needs them for the Lease that elects the replica
writing the routes' status (adapter/config/proxy.py ProxyConfig). Renders nothing.
*/}}
{{- define "zeroscale.fillConfig" -}}
{{- if not (hasKey .Values "_configFilled") -}}
{{- $_ := set .Values "_configFilled" true -}}
{{- $proxy := .Values.config.proxy | default dict -}}
{{- if and .Values.proxy.enabled .Values.routeObjects.enabled (not $proxy.sidecar) -}}
{{- $objects := $proxy.route_objects | default dict -}}
{{- if not (hasKey $objects "enabled") }}{{ $_ := set $objects "enabled" true }}{{ end -}}
{{- if $objects.enabled -}}
{{- $activator := $proxy.activator | default dict -}}
{{- if not $activator.proxy_service -}}
{{- $_ := set $activator "proxy_service" (dict "service" (printf "%s-proxy" (include "zeroscale.fullname" .)) "namespace" .Release.Namespace) -}}
{{- end -}}
{{- if not $activator.lease_namespace }}{{ $_ := set $activator "lease_namespace" .Release.Namespace }}{{ end -}}
{{- $_ := set $proxy "activator" $activator -}}
{{- end -}}
{{- $_ := set $proxy "route_objects" $objects -}}
{{- $_ := set .Values.config "proxy" $proxy -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Whether the proxy serves ZeroscaleRoute objects ("true" or ""), after zeroscale.fillConfig. */}}
{{- define "zeroscale.routeObjects" -}}
{{- include "zeroscale.fillConfig" . -}}
{{- if and .Values.proxy.enabled (dig "proxy" "route_objects" "enabled" false .Values.config) }}true{{ end -}}
{{- end -}}

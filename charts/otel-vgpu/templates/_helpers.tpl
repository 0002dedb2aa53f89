{{/* The chart's name: the app.kubernetes.io/name label, in the selector, so no value changes it (nameOverride names objects only). */}}
{{- define "otel-vgpu.name" -}}
{{- .Chart.Name }}
{{- end }}

{{/* The namespace of the namespaced objects: the release's, unless namespaceOverride says another. */}}
{{- define "otel-vgpu.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{/* Object names: the release name, with the chart's name unless the release name holds it already. */}}
{{- define "otel-vgpu.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default (include "otel-vgpu.name" .) .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The DaemonSet's selector: only labels that no upgrade and no value but the
release's own name change. A selector is immutable; one that held the chart's
version would fail every upgrade (kubermatic #14669, k8s-device-plugin #701).
*/}}
{{- define "otel-vgpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "otel-vgpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object's labels: Helm's standard ones and kustomize's part-of. */}}
{{- define "otel-vgpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "otel-vgpu.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: otel-vgpu
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "otel-vgpu.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "otel-vgpu.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "otel-vgpu.image" -}}
{{- $registry := default .Values.image.registry .Values.global.imageRegistry }}
{{- $image := printf "%s/%s" $registry .Values.image.repository | trimPrefix "/" }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $image .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $image (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* gpu_allocation.txt: the ratio under the comment kustomize/base's file carries. */}}
{{- define "otel-vgpu.ratioFile" -}}
# vGPUs per physical GPU. `auto`: each GPU's ratio is the number of replicas
# the device plugin advertises for it (the kubelet's GetAllocatableResources):
# 1 for a GPU that is not shared, the time-slicing or MPS replicas for one that
# is, per node, with nothing to keep in step. A number (2 = two shares per GPU)
# is for nodes where the kubelet cannot be asked (overlays/non-root).
# Reread when it changes.
{{ .Values.ratio }}
{{- end }}

{{/* The Secret volume that holds basic auth's users: the TLS one, or one of its own. */}}
{{- define "otel-vgpu.usersSecret" -}}
{{- default .Values.tls.secretName .Values.basicAuth.secretName }}
{{- end }}

{{/* The label the Prometheus Operator's objects carry for kube-prometheus-stack, and their extra ones. */}}
{{- define "otel-vgpu.monitorLabels" -}}
{{- $ := index . 0 }}
{{ include "otel-vgpu.labels" $ }}
{{- with $.Values.prometheus.release }}
release: {{ . }}
{{- end }}
{{- with index . 1 }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
A custom resource kind asked for must be in the cluster's API: one line that
names the exact kind, not its group, rather than objects the API refuses or,
as a bare .Capabilities test would give, nothing at all (cert-manager #5162).
`helm template` offline: --api-versions group/version/Kind, or checkApiVersions=false.
*/}}
{{- define "otel-vgpu.requireKind" -}}
{{- $ := index . 0 }}
{{- $kind := index . 1 }}
{{- $value := index . 2 }}
{{- if and $.Values.checkApiVersions (not ($.Capabilities.APIVersions.Has $kind)) }}
{{- fail (printf "%s is on, but the cluster's API has no %s: install its CRD first, or for `helm template` offline pass --api-versions %s (or checkApiVersions=false)" $value $kind $kind) }}
{{- end }}
{{- end }}

{{/* What the namespace must say: the privileged Pod Security level (hostPID and hostPath are outside baseline), and on OpenShift the platform monitoring label. */}}
{{- define "otel-vgpu.namespaceLabels" -}}
pod-security.kubernetes.io/enforce: privileged
pod-security.kubernetes.io/warn: privileged
pod-security.kubernetes.io/audit: privileged
{{- if .Values.openshift.platformMonitoring }}
openshift.io/cluster-monitoring: "true"
{{- end }}
{{- end }}

{{/*
The platform that `platform` names (files/platforms.yaml), applied to .Values in place:
each of its settings where the value is still the chart's default, so that a value the
user set wins. Every template includes this first; applying it twice changes nothing.
*/}}
{{- define "otel-vgpu.platform" -}}
{{- if .Values.platform -}}
{{- $file := .Files.Get "files/platforms.yaml" | fromYaml -}}
{{- $preset := index $file.platforms .Values.platform -}}
{{- if not $preset -}}
{{- fail (printf "platform: %q is not a platform of this chart; valid: %s (files/platforms.yaml)" .Values.platform (keys $file.platforms | sortAlpha | join ", ")) -}}
{{- end -}}
{{- include "otel-vgpu.preset" (dict "values" .Values "defaults" $file.defaults "preset" $preset) -}}
{{- end -}}
{{- end -}}

{{- define "otel-vgpu.preset" -}}
{{- $values := .values -}}
{{- $defaults := .defaults -}}
{{- range $key, $want := .preset -}}
{{- if kindIs "map" $want -}}
{{- include "otel-vgpu.preset" (dict "values" (index $values $key) "defaults" (index $defaults $key) "preset" $want) -}}
{{- else if deepEqual (index $values $key) (index $defaults $key) -}}
{{- $_ := set $values $key $want -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
A Prometheus duration (1h30m, 15s, 500ms; the schema checked its form) in milliseconds.
*/}}
{{- define "otel-vgpu.durationMs" -}}
{{- $ms := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 "y" 31536000000 -}}
{{- $total := 0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h|d|w|y)" . -1 -}}
{{- $unit := regexFind "(ms|s|m|h|d|w|y)$" . -}}
{{- $total = add $total (mul (trimSuffix $unit . | int64) (index $ms $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
A metric pattern, as the agent will compile it (RE2, whole names: otel_vgpu/patterns.py):
refused here, at install, rather than by the agent's pods crash-looping on it. Go's RE2
compiles it, as the agent's does; what it refuses (lookarounds, backreferences, \C, a
repetition above 1000) the agent refuses too (tests/system/test_chart.py holds the two alike).
*/}}
{{- define "otel-vgpu.checkPattern" -}}
{{- $where := index . 0 -}}
{{- $pattern := index . 1 -}}
{{- /* "(?:p)|" matches "" wherever p compiles; regexMatch answers false where it does not. */ -}}
{{- if not (regexMatch (printf "(?:%s)|" $pattern) "") -}}
{{- fail (printf "%s: %q is not an RE2 regular expression, as Prometheus and the agent read them: an unclosed group or bracket, a bad repetition, or a lookaround or backreference, which RE2 lacks" $where $pattern) -}}
{{- end -}}
{{- end -}}

{{/*
A pod's imagePullSecrets: the list given, then global.imagePullSecrets, each a name or a
{name: ...}; none: nothing rendered.
*/}}
{{- define "otel-vgpu.pullSecrets" -}}
{{- $ := index . 0 -}}
{{- $secrets := list -}}
{{- range concat (index . 1) ($.Values.global.imagePullSecrets | default list) -}}
{{- $secrets = append $secrets (ternary (dict "name" .) . (kindIs "string" .)) -}}
{{- end -}}
{{- with $secrets -}}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* The gateway's image, with global.imageRegistry in place of the registry it names, if any. */}}
{{- define "otel-vgpu.collectorImage" -}}
{{- $image := .Values.otlp.collector.image }}
{{- with .Values.global.imageRegistry }}
{{- $host := include "otel-vgpu.registryHost" $image }}
{{- $image = printf "%s/%s" . (ternary (trimPrefix (printf "%s/" $host) $image) $image (ne $host "")) }}
{{- end }}
{{- $image }}
{{- end }}

{{/*
The registry host an image reference starts with, as the container runtimes read one: a first
path component holding a dot or a colon, or localhost; empty where it names none.
*/}}
{{- define "otel-vgpu.registryHost" -}}
{{- $parts := splitList "/" . }}
{{- $first := first $parts }}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $first }}
{{- end }}
{{- end }}

{{/*
What an `auto`/`true`/`false` value comes to: "true" or empty. `auto` is the second argument,
the chart's own answer from the cluster's API; true and false, as booleans or as strings
(`--set-string`), are the user's, and win over it.
*/}}
{{- define "otel-vgpu.switch" -}}
{{- $value := toString (index . 0) -}}
{{- if eq $value "auto" -}}
{{- if index . 1 }}true{{ end -}}
{{- else if eq $value "true" -}}
true
{{- end -}}
{{- end -}}

{{/* The PodMonitor: asked for by name only (no `auto`: the ServiceMonitor is the default monitor). */}}
{{- define "otel-vgpu.podMonitorOn" -}}
{{- include "otel-vgpu.switch" (list .Values.prometheus.podMonitor.enabled false) -}}
{{- end -}}

{{/*
The ServiceMonitor. `auto`: where the API has its kind, as the Prometheus Operator's CRDs
(kube-prometheus-stack's among them) put it there; where the Service it scrapes through is on;
and where the PodMonitor is off, since two monitors would scrape every agent twice and double
every sum over them.
*/}}
{{- define "otel-vgpu.serviceMonitorOn" -}}
{{- $kind := printf "%s/ServiceMonitor" (.Values.prometheus.monitor.apiVersion | default "monitoring.coreos.com/v1") -}}
{{- $auto := and (.Capabilities.APIVersions.Has $kind) .Values.service.enabled (not (include "otel-vgpu.podMonitorOn" .)) -}}
{{- include "otel-vgpu.switch" (list .Values.prometheus.monitor.enabled $auto) -}}
{{- end -}}

{{/* A monitor of either kind renders. */}}
{{- define "otel-vgpu.monitorOn" -}}
{{- if or (include "otel-vgpu.serviceMonitorOn" .) (include "otel-vgpu.podMonitorOn" .) -}}
true
{{- end -}}
{{- end -}}

{{/* The PrometheusRule of the agent's alerts and recording rules. `auto`: where the API has its kind. */}}
{{- define "otel-vgpu.rulesOn" -}}
{{- $auto := .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule" -}}
{{- include "otel-vgpu.switch" (list .Values.prometheus.rules.enabled $auto) -}}
{{- end -}}

{{/*
The pods' prometheus.io annotations. `auto`: where no monitor renders. A Prometheus that reads
them has no operator to give it a monitor; where one does, a job reading them as well would
scrape every agent a second time.
*/}}
{{- define "otel-vgpu.scrapeAnnotationsOn" -}}
{{- include "otel-vgpu.switch" (list .Values.prometheus.scrapeAnnotations (not (include "otel-vgpu.monitorOn" .))) -}}
{{- end -}}

{{/* The dashboard's ConfigMap. `auto`: where a monitor renders, the Prometheus Operator's clusters, whose usual Grafana (kube-prometheus-stack's) loads it. */}}
{{- define "otel-vgpu.dashboardOn" -}}
{{- include "otel-vgpu.switch" (list .Values.grafana.dashboard.enabled (include "otel-vgpu.monitorOn" .)) -}}
{{- end -}}

{{/* The scheme the agent serves /metrics in. */}}
{{- define "otel-vgpu.scheme" -}}
{{- ternary "https" "http" .Values.tls.enabled -}}
{{- end -}}

{{/*
A Prometheus job of one's own that scrapes the release's agents as the monitors do, for the
notes to print where no monitor renders (docs/install.md shows the default release's):
the pods of the release in its namespace, on the metrics port, honor_labels true (the agent's
pod and namespace labels name the GPUs' tenants), the node from the pod's node. Prometheus
adds no namespace, pod or container of the target here, so there is none to drop. The job's
name holds otel-vgpu, which VGPUAgentDown's up{job=~".*otel-vgpu.*"} looks for.
*/}}
{{- define "otel-vgpu.scrapeConfig" -}}
{{- $tls := .Values.tls -}}
- job_name: otel-vgpu
  # The agent's pod and namespace labels name the pods using the GPUs: keep them.
  honor_labels: true
  scrape_interval: {{ .Values.prometheus.monitor.interval }}
  scrape_timeout: {{ .Values.prometheus.monitor.scrapeTimeout }}
  scheme: {{ include "otel-vgpu.scheme" . }}
  metrics_path: /metrics
  {{- if $tls.enabled }}
  tls_config:
    ca_file: /etc/prometheus/secrets/{{ $tls.secretName }}/ca.crt  # ca.crt of Secret {{ $tls.secretName }}, mounted into Prometheus
    server_name: {{ $tls.serverName | default (printf "%s.%s.svc" (include "otel-vgpu.fullname" .) (include "otel-vgpu.namespace" .)) }}
    {{- if $tls.clientCA }}
    cert_file: /etc/prometheus/secrets/{{ $tls.scraperSecretName | default "prometheus-client" }}/tls.crt  # a client certificate ca.crt signed
    key_file: /etc/prometheus/secrets/{{ $tls.scraperSecretName | default "prometheus-client" }}/tls.key
    {{- end }}
  {{- end }}
  {{- if .Values.basicAuth.enabled }}
  basic_auth:
    username: prometheus  # a user of the agent's users file
    password_file: /etc/prometheus/secrets/{{ .Values.basicAuth.scraperSecretName | default "otel-vgpu-scraper" }}/password
  {{- end }}
  kubernetes_sd_configs:
    - role: pod
      namespaces:
        names: [{{ include "otel-vgpu.namespace" . }}]
  relabel_configs:
    # The release's agents, on their metrics port (the monitors' selector).
    - source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_name, __meta_kubernetes_pod_label_app_kubernetes_io_instance, __meta_kubernetes_pod_container_port_name]
      action: keep
      regex: {{ include "otel-vgpu.name" . }};{{ .Release.Name }};metrics
    # The agent's node, as the monitors label it.
    - source_labels: [__meta_kubernetes_pod_node_name]
      target_label: node
{{- end -}}

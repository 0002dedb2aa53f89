{{/*
The PodMonitor or the ServiceMonitor: the same object but for its kind and the name of its
endpoints' list (podMetricsEndpoints, endpoints).
*/}}
{{- define "otel-vgpu.monitor" -}}
{{- $ := index . 0 }}
{{- $monitor := index . 1 }}
{{- $kind := index . 2 }}
{{- $endpoints := index . 3 }}
apiVersion: {{ $monitor.apiVersion | default "monitoring.coreos.com/v1" }}
kind: {{ $kind }}
metadata:
  name: {{ include "otel-vgpu.fullname" $ }}
  namespace: {{ $monitor.namespace | default (include "otel-vgpu.namespace" $) }}
  labels:
    {{- include "otel-vgpu.monitorLabels" (list $ $monitor.additionalLabels) | nindent 4 }}
spec:
  {{- with $monitor.jobLabel }}
  jobLabel: {{ . }}
  {{- end }}
  {{- if $monitor.namespace }}
  namespaceSelector:
    matchNames: [{{ include "otel-vgpu.namespace" $ }}]
  {{- end }}
  selector:
    {{- if $monitor.selectorOverride }}
    {{- toYaml $monitor.selectorOverride | nindent 4 }}
    {{- else }}
    matchLabels:
      {{- include "otel-vgpu.selectorLabels" $ | nindent 6 }}
    {{- end }}
  {{ $endpoints }}:
    {{- include "otel-vgpu.endpoint" (list $ $monitor) | nindent 4 }}
{{- end }}

{{/*
One scrape endpoint of the PodMonitor or the ServiceMonitor. The agent's pod,
namespace and container labels name the pods using the GPUs, not the agent's
own pod: honorLabels keeps them, and the target's own namespace, pod and
container are dropped, since honorLabels would fill them in where a series has
none (every GPU series would get the agent's pod name). The agent is known by
instance and node.
*/}}
{{- define "otel-vgpu.endpoint" -}}
{{- $ := index . 0 }}
{{- $monitor := index . 1 }}
- port: metrics
  path: /metrics
  interval: {{ $monitor.interval }}
  scrapeTimeout: {{ $monitor.scrapeTimeout }}
  honorLabels: true
  {{- $scheme := $monitor.scheme | default (ternary "https" "" $.Values.tls.enabled) }}
  {{- with $scheme }}
  scheme: {{ . }}
  {{- end }}
  {{- with (include "otel-vgpu.tlsConfig" (list $ $monitor) | fromYaml) }}
  tlsConfig:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (include "otel-vgpu.scrapeAuth" (list $ $monitor) | fromYaml) }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  relabelings:
    - sourceLabels: [__meta_kubernetes_pod_node_name]
      targetLabel: node
    - action: labeldrop
      regex: namespace|pod|container
    {{- with $monitor.relabelings }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $monitor.metricRelabelings }}
  metricRelabelings:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/*
The monitor's tlsConfig: the user's where set; else, where the agent serves HTTPS, the CA
from the TLS Secret's ca.crt (cert-manager writes it there) and the Service's DNS name to
verify, which the certificate must hold (pods are scraped by IP); with tls.clientCA, the
scraper's own certificate from tls.scraperSecretName. The Secrets are the monitor's
namespace's, as the Prometheus Operator reads them (docs/deploying-with-prometheus-operator.md).
*/}}
{{- define "otel-vgpu.tlsConfig" -}}
{{- $ := index . 0 -}}
{{- $monitor := index . 1 -}}
{{- if $monitor.tlsConfig -}}
{{- toYaml $monitor.tlsConfig -}}
{{- else if $.Values.tls.enabled -}}
{{- $tls := $.Values.tls -}}
ca:
  secret:
    name: {{ $tls.secretName }}
    key: ca.crt
serverName: {{ $tls.serverName | default (printf "%s.%s.svc" (include "otel-vgpu.fullname" $) (include "otel-vgpu.namespace" $)) }}
{{- if $tls.clientCA }}
{{- if not $tls.scraperSecretName }}
{{- fail "tls.clientCA makes the agent ask scrapers for a client certificate, and the monitor has none: set tls.scraperSecretName (a kubernetes.io/tls Secret whose certificate the TLS Secret's ca.crt signed) or the monitor's tlsConfig, or turn the monitor off (prometheus.monitor.enabled=false: its default, auto, renders it where the Prometheus Operator's API is)" }}
{{- end }}
cert:
  secret:
    name: {{ $tls.scraperSecretName }}
    key: tls.crt
keySecret:
  name: {{ $tls.scraperSecretName }}
  key: tls.key
{{- end }}
{{- end -}}
{{- end -}}

{{/*
The monitor's credentials: its basicAuth or authorization where set (not both: the
Prometheus Operator refuses the pair); else, where the agent asks for basic auth, the
username and password keys of basicAuth.scraperSecretName.
*/}}
{{- define "otel-vgpu.scrapeAuth" -}}
{{- $ := index . 0 -}}
{{- $monitor := index . 1 -}}
{{- if and $monitor.basicAuth $monitor.authorization -}}
{{- fail "a monitor takes basicAuth or authorization, not both (the Prometheus Operator refuses the pair): set one" -}}
{{- else if $monitor.basicAuth -}}
basicAuth: {{- toYaml $monitor.basicAuth | nindent 2 }}
{{- else if $monitor.authorization -}}
authorization: {{- toYaml $monitor.authorization | nindent 2 }}
{{- else if $.Values.basicAuth.enabled -}}
{{- if not $.Values.basicAuth.scraperSecretName -}}
{{- fail "basicAuth.enabled makes the agent ask scrapers for a password, and the monitor has none: set basicAuth.scraperSecretName (a Secret with username and password keys, the password in clear: the users file holds only its hash) or the monitor's basicAuth, or turn the monitor off (prometheus.monitor.enabled=false: its default, auto, renders it where the Prometheus Operator's API is)" -}}
{{- end -}}
basicAuth:
  username:
    name: {{ $.Values.basicAuth.scraperSecretName }}
    key: username
  password:
    name: {{ $.Values.basicAuth.scraperSecretName }}
    key: password
{{- end -}}
{{- end -}}

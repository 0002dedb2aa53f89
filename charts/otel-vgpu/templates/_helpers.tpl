{{/* The chart's name: the app.kubernetes.io/name label, in the selector, so no value changes it. */}}
{{- define "otel-vgpu.name" -}}
{{- .Chart.Name }}
{{- end }}

{{/* Object names: the release name, with the chart's name unless the release name holds it already. */}}
{{- define "otel-vgpu.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "otel-vgpu.name" . }}
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
{{- end }}

{{- define "otel-vgpu.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "otel-vgpu.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "otel-vgpu.image" -}}
{{- $image := printf "%s/%s" .Values.image.registry .Values.image.repository | trimPrefix "/" }}
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

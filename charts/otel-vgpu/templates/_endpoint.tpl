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
  {{- if $.Values.tls.enabled }}
  scheme: https
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

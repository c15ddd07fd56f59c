{{/* The labels Helm's conventions add to every object (on top of the kustomize base's). */}}
{{- define "tessera.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: tessera
{{- end }}

{{/* The plugin pods' selector: the kustomize base's. */}}
{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/component: kubelet-plugin
{{- end }}

{{- define "tessera.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The node config document (config.tessera.dev/v1alpha1 NodeConfig). */}}
{{- define "tessera.nodeConfig" -}}
{{- $c := .Values.nodeConfig -}}
apiVersion: config.tessera.dev/v1alpha1
kind: NodeConfig
{{- with $c.defaultMode }}
defaultMode: {{ . }}
{{- end }}
{{- with $c.gpus }}
gpus:
{{ toYaml . }}
{{- end }}
{{- with $c.exclude }}
exclude:
{{ toYaml . }}
{{- end }}
sliceLayout: {{ $c.sliceLayout }}
sharedSlots: {{ $c.sharedSlots }}
deviceMetadata: {{ $c.deviceMetadata }}
{{- with $c.health }}
health:
{{ toYaml . | indent 2 }}
{{- end }}
{{- end }}

{{/* The mock node document: mock.node, else files/mock-node.yaml as it is. */}}
{{- define "tessera.mockNode" -}}
{{- if .Values.mock.node -}}
{{ toYaml .Values.mock.node }}
{{- else -}}
{{ .Files.Get "files/mock-node.yaml" }}
{{- end }}
{{- end }}

{{/* "a" joined with "b" without a doubled slash: "/" + "dev" = "/dev". */}}
{{- define "tessera.join" -}}
{{ printf "%s/%s" (trimSuffix "/" (index . 0)) (index . 1) }}
{{- end }}

{{/* The listen address, when it differs from the plugin's default (:9464). */}}
{{- define "tessera.metricsAddr" -}}
{{- if or .Values.metrics.host (ne (int .Values.metrics.port) 9464) -}}
{{ .Values.metrics.host }}:{{ .Values.metrics.port }}
{{- end }}
{{- end }}

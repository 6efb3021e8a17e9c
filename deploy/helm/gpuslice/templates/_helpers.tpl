{{/* The image reference of every container. */}}
{{- define "gpuslice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "gpuslice.labels" -}}
app.kubernetes.io/name: gpuslice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* The DaemonSet's selector (never changes across upgrades). */}}
{{- define "gpuslice.selector" -}}
app.kubernetes.io/name: gpuslice
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The plugin's service account (the admission policy names it). */}}
{{- define "gpuslice.pluginAccount" -}}
{{ .Release.Name }}-dra
{{- end -}}

{{/* Mounts and variables that reach the NVIDIA driver without its runtime class. */}}
{{- define "gpuslice.driverMounts" -}}
{{- range $i, $m := .Values.driver.mounts }}
- name: driver-{{ $i }}
  mountPath: {{ $m.containerPath }}
  readOnly: {{ $m.readOnly | default false }}
{{- end }}
{{- end -}}
{{- define "gpuslice.driverEnv" -}}
{{- with .Values.driver.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

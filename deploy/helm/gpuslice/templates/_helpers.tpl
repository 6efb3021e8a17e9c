{{/* The image reference of every container: by digest when one is given, else by tag. */}}
{{- define "gpuslice.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* Labels on every object but the cleanup Job's pods (gpuslice.cleanupPodLabels). */}}
{{- define "gpuslice.labels" -}}
{{ include "gpuslice.selector" . }}
{{ include "gpuslice.commonLabels" . }}
{{- end -}}

{{/* What every label set has beside its name. */}}
{{- define "gpuslice.commonLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* The DaemonSet's selector, and the metrics Service's. Immutable in a DaemonSet: never
     change it, or every upgrade of an installed release fails. */}}
{{- define "gpuslice.selector" -}}
app.kubernetes.io/name: gpuslice
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The cleanup Job's pods: not the DaemonSet's selector (a pod matching it that the
     DaemonSet does not own is one its controller must not see), nor the Service's. */}}
{{- define "gpuslice.cleanupPodLabels" -}}
app.kubernetes.io/name: gpuslice-cleanup
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "gpuslice.commonLabels" . }}
{{- end -}}

{{/* The plugin's service account (the admission policy names it). */}}
{{- define "gpuslice.pluginAccount" -}}
{{ .Release.Name }}-dra
{{- end -}}

{{/* Mounts of the NVIDIA driver's host paths, for nodes without its runtime class, in both
     containers (nothing when driver.mounts is empty). */}}
{{- define "gpuslice.driverMounts" -}}
{{- range $i, $m := .Values.driver.mounts }}
- name: driver-{{ $i }}
  mountPath: {{ $m.containerPath }}
  readOnly: {{ $m.readOnly | default false }}
{{- end }}
{{- end -}}

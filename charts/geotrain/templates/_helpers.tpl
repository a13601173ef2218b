{{/* Labels of every object of the release. */}}
{{- define "geotrain.labels" -}}
app.kubernetes.io/name: geotrain
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: geotrain
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of the controller pods. */}}
{{- define "geotrain.selectorLabels" -}}
app.kubernetes.io/name: geotrain
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "geotrain.controllerImage" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "geotrain.workerImage" -}}
{{ .Values.workerImage.repository }}:{{ .Values.workerImage.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "geotrain.validateRole" -}}
{{- if not (has .Values.role (list "hub" "member")) -}}
{{- fail (printf "role: %q is not allowed (allowed: hub, member)" .Values.role) -}}
{{- end -}}
{{- end -}}

{{/* The chart's name: nameOverride, else "geotrain". */}}
{{- define "geotrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The prefix of every object name: fullnameOverride, else the release name
(when it already contains the chart's name, as "geotrain" does), else
RELEASE-NAME. Cluster-scoped objects (ClusterRoles and their bindings) carry
it too, so that two releases in one cluster never write the same object.
*/}}
{{- define "geotrain.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "geotrain.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
FULLNAME-SUFFIX, the prefix shortened so that the whole stays a DNS label
(63 characters; Service names must be one). Usage:
  include "geotrain.objectName" (list . "controller")
*/}}
{{- define "geotrain.objectName" -}}
{{- $ctx := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- $prefix := include "geotrain.fullname" $ctx | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $prefix $suffix -}}
{{- end -}}

{{/* The controller's ServiceAccount: serviceAccount.name, else FULLNAME-controller. */}}
{{- define "geotrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.name -}}
{{- .Values.serviceAccount.name -}}
{{- else if .Values.serviceAccount.create -}}
{{- include "geotrain.objectName" (list . "controller") -}}
{{- else -}}
default
{{- end -}}
{{- end -}}

{{/* Labels of every object of the release. */}}
{{- define "geotrain.labels" -}}
app.kubernetes.io/name: {{ include "geotrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: geotrain
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of the controller pods. */}}
{{- define "geotrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "geotrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{/*
The labels the controller puts on every worker pod it creates
(controller/reconcile/render.cc, labels()), whatever the release: the
PodMonitor selects workers by them.
*/}}
{{- define "geotrain.workerSelectorLabels" -}}
app.kubernetes.io/name: geotrain
app.kubernetes.io/component: worker
app.kubernetes.io/managed-by: geotrain-controller
{{- end -}}

{{- define "geotrain.controllerImage" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "geotrain.workerImage" -}}
{{ .Values.workerImage.repository }}:{{ .Values.workerImage.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
Whether a Prometheus Operator object is wanted: enabled true, or auto and its
kind is served by the cluster. Usage:
  include "geotrain.monitorEnabled" (list . .Values.metrics.podMonitor "PodMonitor")
*/}}
{{- define "geotrain.monitorEnabled" -}}
{{- $ctx := index . 0 -}}
{{- $enabled := toString (index . 1).enabled -}}
{{- $served := $ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" (index . 2)) -}}
{{- if or (eq $enabled "true") (and (eq $enabled "auto") $served) -}}true{{- end -}}
{{- end -}}

{{/*
What values.schema.json cannot say in words a user understands: the role,
the name overrides (DNS labels) and the members' names (a DNS label, not
"local", each once), each refusal naming the value as --set spells it.
*/}}
{{- define "geotrain.validate" -}}
{{- if not (has .Values.role (list "hub" "member")) -}}
{{- fail (printf "role: %q is not allowed (allowed: hub, member)" .Values.role) -}}
{{- end -}}
{{- range $field := list "nameOverride" "fullnameOverride" -}}
{{- $v := index $.Values $field | default "" -}}
{{- if and $v (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $v)) -}}
{{- fail (printf "%s: %q is not allowed: it starts every object name, so it must be a DNS label (lower-case letters, digits and '-', starting and ending with a letter or digit)" $field $v) -}}
{{- end -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $i, $m := .Values.members -}}
{{- $field := printf "members[%d].name" $i -}}
{{- if eq $m.name "local" -}}
{{- fail (printf "%s: \"local\" is not allowed: local is the hub's own cluster, which TrainingJobs name without a member entry; name the member after its region (e.g. tokyo)" $field) -}}
{{- end -}}
{{- if or (gt (len $m.name) 63) (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $m.name)) -}}
{{- fail (printf "%s: %q is not allowed: a member's name must be a DNS label (lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63 characters), e.g. tokyo" $field $m.name) -}}
{{- end -}}
{{- if hasKey $seen $m.name -}}
{{- fail (printf "%s: %q is not allowed: members[%d] has the same name" $field $m.name (get $seen $m.name)) -}}
{{- end -}}
{{- $_ := set $seen $m.name $i -}}
{{- end -}}
{{- end -}}

{{/* Chart name, truncated to the 63 characters DNS labels allow. */}}
{{- define "kairos.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; stays under 50 characters to leave room for suffixes. */}}
{{- define "kairos.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kairos.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "kairos.labels" -}}
helm.sh/chart: {{ include "kairos.chart" . }}
app.kubernetes.io/name: {{ include "kairos.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kairos
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "admission"). */}}
{{- define "kairos.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kairos.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "kairos.componentLabels" -}}
{{ include "kairos.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "kairos.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end }}

{{/* The Secret that holds the database URL and the one that holds the API token. */}}
{{- define "kairos.databaseSecretName" -}}
{{- default (include "kairos.fullname" .) .Values.database.existingSecret }}
{{- end }}
{{- define "kairos.authSecretName" -}}
{{- default (include "kairos.fullname" .) .Values.auth.existingSecret }}
{{- end }}

{{/* The database URL the chart stores when no existingSecret is given. */}}
{{- define "kairos.databaseUrl" -}}
{{- if .Values.database.url -}}
{{ .Values.database.url }}
{{- else -}}
{{- with .Values.database -}}
postgresql+asyncpg://{{ .user }}@{{ .host }}:{{ .port }}/{{ .name }}
{{- end -}}
{{- end -}}
{{- end }}

{{/* Where the node agent creates job pods (and so where its Role applies). */}}
{{- define "kairos.podNamespace" -}}
{{- default .Release.Namespace .Values.nodeAgent.podNamespace }}
{{- end }}

{{- define "kairos.serviceAccountName" -}}
{{- printf "%s-%s" (include "kairos.fullname" .root) .component }}
{{- end }}

{{/*
Environment every Kairos container gets: (dict "root" $ "service" "admission"), and
optionally "dbSecret" to read the database URL from another Secret.
*/}}
{{- define "kairos.commonEnv" -}}
{{- $root := .root -}}
- name: KAIROS_SERVICE_NAME
  value: {{ .service | quote }}
- name: KAIROS_KAFKA_BOOTSTRAP
  value: {{ required "kafka.bootstrap is required (host:port of your Kafka brokers)" $root.Values.kafka.bootstrap | quote }}
- name: KAIROS_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .dbSecret | default (include "kairos.databaseSecretName" $root) }}
      key: {{ $root.Values.database.existingSecretKey }}
{{- with $root.Values.database.passwordSecret.name }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $root.Values.database.passwordSecret.key }}
{{- end }}
- name: KAIROS_HTTP_HOST
  value: "0.0.0.0"
- name: KAIROS_HTTP_PORT
  value: {{ $root.Values.httpPort | quote }}
- name: KAIROS_LOG_LEVEL
  value: {{ $root.Values.logLevel | quote }}
{{- end }}

{{/* HTTP probes on /healthz (liveness, startup) and /readyz (readiness). */}}
{{- define "kairos.probes" -}}
startupProbe:
  httpGet:
    path: /healthz
    port: http
  periodSeconds: 5
  failureThreshold: {{ .Values.probes.startupFailureThreshold }}
livenessProbe:
  httpGet:
    path: /healthz
    port: http
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: http
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
{{- end }}

{{/* Pod annotations that roll the pods when their configuration changes. */}}
{{- define "kairos.configChecksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- end }}

{{/* KAIROS_AGENT_TOKEN for admission and the node agents, when auth.agentToken.enabled. */}}
{{- define "kairos.agentTokenEnv" -}}
{{- with .Values.auth.agentToken }}
{{- if .enabled }}
- name: KAIROS_AGENT_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ default (include "kairos.fullname" $) .existingSecret }}
      key: {{ .existingSecretKey }}
{{- end }}
{{- end }}
{{- end }}

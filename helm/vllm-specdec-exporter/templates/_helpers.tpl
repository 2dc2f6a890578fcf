{{/*
Names and labels. They use only .Values and .Release (never .Chart), so a parent
chart can include the container and volume templates with
(dict "Values" .Values.<this chart's key> "Release" .Release).
*/}}
{{- define "vllm-specdec-exporter.name" -}}
{{- default "vllm-specdec-exporter" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vllm-specdec-exporter.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "vllm-specdec-exporter.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "vllm-specdec-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vllm-specdec-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vllm-specdec-exporter.labels" -}}
{{ include "vllm-specdec-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vllm-specdec-exporter
app.kubernetes.io/component: {{ .Values.mode }}
{{- end -}}

{{- define "vllm-specdec-exporter.configMapName" -}}
{{- printf "%s-config" (include "vllm-specdec-exporter.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Rendered only when enabled and the CRD API exists, or when forced. */}}
{{- define "vllm-specdec-exporter.crdEnabled" -}}
{{- $section := index .root.Values .section -}}
{{- if and $section.enabled (or $section.force (.root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind))) -}}
true
{{- end -}}
{{- end -}}

{{/*
The exporter container. Include it in the vLLM pod's containers:
  {{- include "vllm-specdec-exporter.container" (dict "Values" (index .Values "vllm-specdec-exporter") "Release" .Release) | nindent 8 }}
*/}}
{{- define "vllm-specdec-exporter.container" -}}
- name: vllm-specdec-exporter
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - serve
    - --config.file=/etc/vllm-specdec-exporter/config.yaml
    - --web.listen-address=:{{ .Values.port }}
  env:
    - name: PYTHONDONTWRITEBYTECODE
      value: "1"
  ports:
    - name: {{ .Values.portName }}
      containerPort: {{ .Values.port }}
      protocol: TCP
  livenessProbe:
    httpGet:
      path: /healthz
      port: {{ .Values.portName }}
    {{- toYaml .Values.livenessProbe | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: {{ .Values.portName }}
    {{- toYaml .Values.readinessProbe | nindent 4 }}
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: vllm-specdec-exporter-config
      mountPath: /etc/vllm-specdec-exporter
      readOnly: true
    {{- if .Values.bearerTokenSecret.name }}
    - name: vllm-specdec-exporter-token
      mountPath: /etc/vllm-specdec-exporter/token
      readOnly: true
    {{- end }}
{{- end -}}

{{/* The volumes the container needs: add them to the vLLM pod's volumes. */}}
{{- define "vllm-specdec-exporter.volumes" -}}
- name: vllm-specdec-exporter-config
  configMap:
    name: {{ include "vllm-specdec-exporter.configMapName" . }}
{{- if .Values.bearerTokenSecret.name }}
- name: vllm-specdec-exporter-token
  secret:
    secretName: {{ .Values.bearerTokenSecret.name }}
{{- end }}
{{- end -}}

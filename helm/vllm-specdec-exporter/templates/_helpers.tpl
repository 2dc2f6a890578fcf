{{/*
Names and labels. A parent chart includes the container and volume templates with
this chart's own scope, (index .Subcharts "vllm-specdec-exporter"), so that they see
its values, defaults and appVersion.
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

{{- define "vllm-specdec-exporter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vllm-specdec-exporter.labels" -}}
helm.sh/chart: {{ include "vllm-specdec-exporter.chart" . }}
{{ include "vllm-specdec-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
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

{{/* image.tag, or the chart's appVersion when it is empty. */}}
{{- define "vllm-specdec-exporter.image" -}}
{{- $tag := .Values.image.tag -}}
{{- if not $tag -}}
{{- if not .Chart -}}
{{- fail "image.tag: empty means this chart's appVersion, which this include cannot see: include the container with (index .Subcharts \"vllm-specdec-exporter\"), or set image.tag" -}}
{{- end -}}
{{- $tag = .Chart.AppVersion -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{/* The web config (TLS, basic auth) is mounted here, from webConfig.secretName. */}}
{{- define "vllm-specdec-exporter.webConfigDir" -}}
/etc/vllm-specdec-exporter/web
{{- end -}}

{{/* The exporter serves HTTPS: a web config from a Secret that holds tls_server_config. */}}
{{- define "vllm-specdec-exporter.https" -}}
{{- if and .Values.webConfig.secretName .Values.webConfig.tls -}}
true
{{- end -}}
{{- end -}}

{{/*
The exporter's endpoint of a PodMonitor / ServiceMonitor, after its port:
(dict "root" . "monitor" .Values.podMonitor).
scheme defaults to https when the exporter serves TLS.
*/}}
{{- define "vllm-specdec-exporter.monitorEndpoint" -}}
{{- $m := .monitor -}}
path: /metrics
{{- $scheme := $m.scheme | default (ternary "https" "" (eq (include "vllm-specdec-exporter.https" .root) "true")) }}
{{- with $scheme }}
scheme: {{ . }}
{{- end }}
{{- with $m.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $m.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- include "vllm-specdec-exporter.monitorTiming" $m }}
{{- with $m.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* interval, scrapeTimeout and relabelings: shared by every endpoint of a monitor. */}}
{{- define "vllm-specdec-exporter.monitorTiming" -}}
{{- with .interval }}
interval: {{ . }}
{{- end }}
{{- with .scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
{{- with .relabelings }}
relabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* jobLabel and sampleLimit, at the monitor's spec level. */}}
{{- define "vllm-specdec-exporter.monitorSpec" -}}
{{- with .jobLabel }}
jobLabel: {{ . }}
{{- end }}
{{- with .sampleLimit }}
sampleLimit: {{ . }}
{{- end }}
{{- end -}}

{{/*
The exporter container. Include it in the vLLM pod's containers, with what that vLLM is
given (its --model and --speculative-config, from your values), so that the exporter knows
the deployment's model and k, and so its baseline profile, from the deployment itself:
  {{- include "vllm-specdec-exporter.container" (dict "chart" (index .Subcharts "vllm-specdec-exporter") "model" .Values.model "speculativeConfig" .Values.speculativeConfig) | nindent 8 }}
"model", "speculativeConfig" and "profile" stand over this chart's `vllm` values of the same
names. With nothing to pass, this chart's scope alone (its `vllm` values apply):
  {{- include "vllm-specdec-exporter.container" (index .Subcharts "vllm-specdec-exporter") | nindent 8 }}
*/}}
{{- define "vllm-specdec-exporter.container" -}}
{{- if hasKey . "chart" }}
{{- $unknown := without (keys .) "chart" "model" "speculativeConfig" "profile" }}
{{- if $unknown }}
{{- fail (printf "vllm-specdec-exporter.container: unknown key %s (valid: chart, model, speculativeConfig, profile)" (sortAlpha $unknown | join ", ")) }}
{{- end }}
{{- include "vllm-specdec-exporter.container" (dict "Values" .chart.Values "Chart" .chart.Chart "Files" .chart.Files "vllm" (omit . "chart")) }}
{{- else }}
{{- /* The chart's own flags, once: the container's args, and what extraArgs may not repeat (serve
refuses a flag given twice: one of them in extraArgs would crash-loop the pod). */}}
{{- $own := list "--config.file=/etc/vllm-specdec-exporter/config.yaml" (printf "--web.listen-address=:%v" .Values.port) }}
{{- if .Values.webConfig.secretName }}
{{- $own = append $own (printf "--web.config.file=%s/%s" (include "vllm-specdec-exporter.webConfigDir" .) .Values.webConfig.key) }}
{{- end }}
{{- $own = concat $own (include "vllm-specdec-exporter.vllmArgs" . | fromYamlArray) }}
{{- $given := list }}
{{- range $extra := .Values.extraArgs }}
{{- $flag := regexReplaceAll "=.*$" (toString $extra) "" }}
{{- if and (hasPrefix "--" $flag) (ne $flag "--vllm.url") (has $flag $given) }}
{{- fail (printf "extraArgs: %s is given twice: serve refuses a flag given twice (only --vllm.url repeats)" $flag) }}
{{- end }}
{{- $given = append $given $flag }}
{{- range $own }}
{{- if and (hasPrefix "--" $flag) (hasPrefix (printf "%s=" $flag) .) }}
{{- fail (printf "extraArgs: %s is set by the chart (its values: port, webConfig, vllm): serve refuses a flag given twice" $flag) }}
{{- end }}
{{- end }}
{{- end }}
- name: vllm-specdec-exporter
  image: {{ include "vllm-specdec-exporter.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    {{- toYaml (concat (list "serve") $own (.Values.extraArgs | default list)) | nindent 4 }}
  env:
    - name: PYTHONDONTWRITEBYTECODE
      value: "1"
  ports:
    - name: {{ .Values.portName }}
      containerPort: {{ .Values.port }}
      protocol: TCP
  {{- /* The probes give the port's number: a name works on every Kubernetes, but podman's
         `kube play` (4.3) turns a named probe port into port 0 (docs/image.md). */}}
  livenessProbe:
    httpGet:
      path: /healthz
      port: {{ .Values.port }}
      {{- if include "vllm-specdec-exporter.https" . }}
      scheme: HTTPS
      {{- end }}
    {{- toYaml .Values.livenessProbe | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: {{ .Values.port }}
      {{- if include "vllm-specdec-exporter.https" . }}
      scheme: HTTPS
      {{- end }}
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
    {{- if .Values.webConfig.secretName }}
    # The whole Secret as a directory (no subPath), so that a rotated certificate
    # or password reaches the exporter, which re-reads its web config.
    - name: vllm-specdec-exporter-web
      mountPath: {{ include "vllm-specdec-exporter.webConfigDir" . }}
      readOnly: true
    {{- end }}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
{{- end -}}

{{/*
What the vLLM runs, as the exporter's --vllm.* flags (every target's model, method, k and
profile): the include's "model", "speculativeConfig" and "profile" (under .vllm) over the
`vllm` values. The method and k are read from vLLM's --speculative-config (JSON text, or a
mapping). A profile of config.baselines.profiles for another k than that is refused here;
the exporter refuses the rest at start-up (an unknown name, a shipped profile for another k).
*/}}
{{- define "vllm-specdec-exporter.vllmArgs" -}}
{{- $given := .vllm | default dict }}
{{- $values := .Values.vllm | default dict }}
{{- $model := index $given "model" | default $values.model }}
{{- $profile := index $given "profile" | default $values.profile }}
{{- $spec := index $given "speculativeConfig" | default $values.speculativeConfig | default dict }}
{{- if kindIs "string" $spec }}
{{- $text := $spec }}
{{- $spec = fromJson $text }}
{{- if hasKey $spec "Error" }}
{{- fail (printf "vllm.speculativeConfig: %s is not vLLM's --speculative-config JSON object (%s)" (trunc 100 $text) $spec.Error) }}
{{- end }}
{{- end }}
{{- if not (kindIs "map" $spec) }}
{{- fail (printf "vllm.speculativeConfig: %s is not vLLM's --speculative-config (JSON text or a mapping)" (trunc 100 (toJson $spec))) }}
{{- end }}
{{- $k := index $spec "num_speculative_tokens" }}
{{- /* The exporter's largest k (generated); an include of the older form passes no .Files: not checked. */}}
{{- $maxK := 0 }}
{{- with .Files }}{{ $maxK = (.Get "files/rule-defaults.yaml" | fromYaml).maxK }}{{ end }}
{{- if and $maxK (not (kindIs "invalid" $k)) (not (and (regexMatch "^[1-9][0-9]*$" (toString $k)) (ge (int $k) 1) (le (int $k) (int $maxK)))) }}
{{- fail (printf "vllm.speculativeConfig: num_speculative_tokens %v is not an integer from 1 to %v (the exporter's largest k): it would refuse --vllm.k at start-up" (trunc 100 (toString $k)) $maxK) }}
{{- end }}
{{- if and $profile $k }}
{{- $first := true }}
{{- range (((.Values.config | default dict).baselines | default dict).profiles | default list) }}
{{- if and $first (eq (toString .name) (toString $profile)) }}
{{- $first = false }}
{{- if ne (float64 .k) (float64 $k) }}
{{- fail (printf "vllm.profile: %s is for k=%v (config.baselines.profiles), but vLLM's --speculative-config has num_speculative_tokens %v: name the profile for k=%v, or leave vllm.profile out to match one by model" $profile .k $k $k) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- with $model }}
- {{ printf "--vllm.model=%v" . | quote }}
{{- end }}
{{- with index $spec "method" }}
- {{ printf "--vllm.method=%v" . | quote }}
{{- end }}
{{- with $k }}
- {{ printf "--vllm.k=%v" . | quote }}
{{- end }}
{{- with $profile }}
- {{ printf "--vllm.profile=%v" . | quote }}
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
{{- if .Values.webConfig.secretName }}
- name: vllm-specdec-exporter-web
  secret:
    secretName: {{ .Values.webConfig.secretName }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

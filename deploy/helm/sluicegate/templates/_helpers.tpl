{{/* The name of every object: <inferencePool.name>-epp. */}}
{{- define "sluicegate.name" -}}
{{- printf "%s-epp" .Values.inferencePool.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object: the ones deploy/epp carries, and Helm's own. */}}
{{- define "sluicegate.labels" -}}
app.kubernetes.io/name: sluicegate
app.kubernetes.io/component: endpoint-picker
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The selector of the Deployment and the Service (stable across upgrades). */}}
{{- define "sluicegate.selector" -}}
app: {{ include "sluicegate.name" . }}
{{- end -}}

{{- define "sluicegate.image" -}}
{{- $image := .Values.inferenceExtension.image -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}

{{/* The shipped `default` preset: queue 2, KV cache 2, prefix cache 3. */}}
{{- define "sluicegate.defaultProfile" -}}
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: max-score-picker}
{{- end -}}

{{/* The shipped `predicted-latency` preset, as deploy/overlays/predictor-sidecars has it. */}}
{{- define "sluicegate.predictedLatencyProfile" -}}
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true, hardwareAware: true}
- name: strict-affinity-filter
  type: prefix-cache-affinity-filter
  parameters: {affinityThreshold: 0.99, ttftSource: latencyPredictor, maxTTFTPenaltyMs: 5000}
- name: loose-affinity-filter
  type: prefix-cache-affinity-filter
  parameters: {affinityThreshold: 0.80, ttftSource: latencyPredictor, maxTTFTPenaltyMs: 5000}
- type: slo-headroom-tier-filter
- type: latency-scorer
  parameters: {headroomSelectionStrategy: load, capacityNormalization: measured}
- type: weighted-random-picker
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: predicted-latency-producer}
  - {pluginRef: strict-affinity-filter}
  - {pluginRef: slo-headroom-tier-filter}
  - {pluginRef: loose-affinity-filter}
  - {pluginRef: latency-scorer}
  - {pluginRef: weighted-random-picker}
{{- end -}}

{{/* The EndpointPickerConfig the ConfigMap holds, as a map. */}}
{{- define "sluicegate.config" -}}
{{- $ext := .Values.inferenceExtension -}}
{{- $config := dict -}}
{{- if $ext.pluginsConfig -}}
{{- $config = deepCopy $ext.pluginsConfig -}}
{{- else if $ext.latencyPredictor.enabled -}}
{{- $config = include "sluicegate.predictedLatencyProfile" . | fromYaml -}}
{{- else -}}
{{- $config = include "sluicegate.defaultProfile" . | fromYaml -}}
{{- end -}}
{{- $_ := set $config "apiVersion" "inference.networking.x-k8s.io/v1alpha1" -}}
{{- $_ := set $config "kind" "EndpointPickerConfig" -}}
{{- if $ext.flowControl.enabled -}}
{{- $gates := default (list) $config.featureGates -}}
{{- $_ := set $config "featureGates" (append $gates "flowControl" | uniq) -}}
{{- end -}}
{{- with $ext.flowControl.settings -}}
{{- $_ := set $config "flowControl" . -}}
{{- end -}}
{{- with $ext.flowControl.saturationDetector -}}
{{- $_ := set $config "saturationDetector" . -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The prediction servers' URLs, comma-separated (PREDICTION_SERVER_URL). */}}
{{- define "sluicegate.predictionServerUrls" -}}
{{- $servers := .Values.inferenceExtension.latencyPredictor.predictionServers -}}
{{- $urls := list -}}
{{- range $i := until (int $servers.count) -}}
{{- $urls = append $urls (printf "http://localhost:%d" (add (int $servers.startPort) $i)) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/* The suffix of prediction server i's container, port and volume names: none for the
first (as in deploy/overlays/predictor-sidecars), then -2, -3, ... */}}
{{- define "sluicegate.predictionServerSuffix" -}}
{{- if ne (int .) 0 -}}{{ printf "-%d" (add . 1) }}{{- end -}}
{{- end -}}

{{/* A Spark job run by the Kubeflow Spark operator (`runner: spark-operator`): the spec
of a SparkApplication (a ScheduledSparkApplication's template too). Pass the same dict
as the gazette.spark.* templates. The operator runs spark-submit in cluster mode: the
driver's pod runs the job's module file, its executors are pods. The image's entrypoint
is `python`, not Spark's: both pods' templates give the command (the driver's drops the
`driver` argument Spark passes first and runs spark-submit in client mode, as Spark's own
image does; the executors' is the chart's executor backend). */}}
{{- define "gazette.spark.application" -}}
{{- $job := .job -}}
{{- $args := list -}}
{{- range $job.args }}{{ $args = append $args (tpl (toString .) $.ctx) }}{{ end -}}
{{- $site := .ctx.Values.sparkJobs.sitePackages -}}
type: Python
pythonVersion: "3"
mode: cluster
sparkVersion: {{ .ctx.Values.sparkJobs.sparkVersion | quote }}
image: {{ .image }}
imagePullPolicy: {{ .pullPolicy }}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - {{ .name }}
  {{- end }}
{{- end }}
mainApplicationFile: {{ printf "local://%s/gazette_spark/%s.py" $site $job.job | quote }}
{{- with $args }}
arguments:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if gt (int $job.backoffLimit) 0 }}
restartPolicy:
  type: OnFailure
  onFailureRetries: {{ $job.backoffLimit }}
  onSubmissionFailureRetries: {{ $job.backoffLimit }}
{{- else }}
restartPolicy:
  type: Never
{{- end }}
{{- if not (kindIs "invalid" $job.ttlSecondsAfterFinished) }}
timeToLiveSeconds: {{ $job.ttlSecondsAfterFinished }}
{{- end }}
sparkConf:
  # (no claims: executors use emptyDir)
  spark.kubernetes.driver.ownPersistentVolumeClaim: "false"
  spark.kubernetes.driver.reusePersistentVolumeClaim: "false"
  {{- range $key, $value := $job.conf }}
  {{ $key }}: {{ toString $value | quote }}
  {{- end }}
driver:
  cores: 1
  memory: {{ $job.driverMemory | default "1g" | quote }}
  serviceAccount: {{ .serviceAccount }}
  labels:
    {{- include "gazette.labels" .labels | nindent 4 }}
  env:
    {{- include "gazette.spark.env" . | nindent 4 }}
  template:
    {{- with $job.podAnnotations }}
    metadata:
      annotations:
        {{- toYaml . | nindent 8 }}
    {{- end }}
    spec:
      {{- include "gazette.spark.podCommon" . | nindent 6 }}
      containers:
        - name: spark-kubernetes-driver
          command:
            - /bin/sh
            - -c
            - 'shift; exec spark-submit --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" --deploy-mode client "$@"'
            - spark-driver
          securityContext:
            {{- include "gazette.containerSecurityContext" . | nindent 12 }}
          volumeMounts:
            - {name: tmp, mountPath: /tmp}
            - {name: home, mountPath: /home/gazette}
      volumes:
        - name: tmp
          emptyDir: {}
        - name: home
          emptyDir: {}
executor:
  instances: {{ $job.executors.instances }}
  cores: {{ $job.executors.cores }}
  memory: {{ $job.executors.memory | quote }}
  labels:
    {{- include "gazette.labels" (dict "ctx" .ctx "component" (printf "%s-executor" .labels.component | trunc 63 | trimSuffix "-")) | nindent 4 }}
  env:
    {{- include "gazette.spark.env" . | nindent 4 }}
  template:  # (the pod template's metadata and spec, as a PodTemplateSpec has them)
    {{- $pod := include "gazette.spark.executorPod" . | fromYaml }}
    {{- toYaml (dict "metadata" $pod.metadata "spec" $pod.spec) | nindent 4 }}
{{- end -}}

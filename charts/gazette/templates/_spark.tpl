{{/* The pieces of a Spark job (templates/spark-jobs.yaml). Each takes (dict "ctx" $ "job"
<the job's values over sparkJobs.defaults, with fullname and k8s> "labels" <its labels'
dict> "image" <the spark image> "pullPolicy" <its pull policy> "serviceAccount" <the
service account of k8s-master jobs>). */}}

{{/* A job's objects' name: pass (dict "ctx" $ "name" <the job's name>). 52 characters at
most, a CronJob's limit (its Jobs' names add 11). */}}
{{- define "gazette.spark.fullname" -}}
{{- printf "%s-spark-%s" (include "gazette.fullname" .ctx) .name | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{/* A job's values over sparkJobs.defaults, as YAML: pass (dict "dst" <defaults> "src"
<the job>). Maps merge key by key, anything else (lists, and scalars such as 0 or false,
which sprig's mergeOverwrite would not let override a default) replaces. */}}
{{- define "gazette.spark.withDefaults" -}}
{{- $out := deepCopy .dst -}}
{{- range $key, $value := .src -}}
{{- if and (kindIs "map" $value) (kindIs "map" (get $out $key)) -}}
{{- $_ := set $out $key (include "gazette.spark.withDefaults" (dict "dst" (get $out $key) "src" $value) | fromYaml) -}}
{{- else -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* Where the executors' pod template is mounted in the driver's pod. */}}
{{- define "gazette.spark.templateDir" -}}
/etc/gazette/spark
{{- end -}}

{{/* The container's arguments after the `python` entrypoint: the job's module and args
(templates, as journals in values are: "{{ include \"gazette.minio.store\" . }}"), then
--master and the Spark settings as repeated --conf key=value (the chart's, then the job's
`conf`, so the job's win). Kubernetes expands $(POD_IP), $(POD_NAME) and any $(VAR) of
the container's env, such as $(GAZETTE_BROKER_ADDRESS). */}}
{{- define "gazette.spark.args" -}}
{{- $job := .job -}}
{{- $args := list "-m" (printf "gazette_spark.%s" $job.job) -}}
{{- range $job.args }}{{ $args = append $args (tpl (toString .) $.ctx) }}{{ end -}}
{{- $conf := list -}}
{{- if $job.k8s -}}
{{- $args = concat $args (list "--master" "k8s://https://kubernetes.default.svc") -}}
{{- $conf = list
  (list "spark.kubernetes.container.image" .image)
  (list "spark.kubernetes.container.image.pullPolicy" .pullPolicy)
  (list "spark.kubernetes.namespace" .ctx.Release.Namespace)
  (list "spark.kubernetes.authenticate.driver.serviceAccountName" .serviceAccount)
  (list "spark.kubernetes.driver.pod.name" "$(POD_NAME)")
  (list "spark.kubernetes.executor.podTemplateFile" (printf "%s/executor-pod.yaml" (include "gazette.spark.templateDir" .)))
  (list "spark.executor.instances" (toString $job.executors.instances))
  (list "spark.executor.cores" (toString $job.executors.cores))
  (list "spark.executor.memory" (toString $job.executors.memory))
  (list "spark.driver.host" "$(POD_IP)")
  (list "spark.driver.bindAddress" "0.0.0.0")
  (list "spark.kubernetes.driver.service.deleteOnTermination" "false")
  (list "spark.kubernetes.driver.ownPersistentVolumeClaim" "false")
  (list "spark.kubernetes.driver.reusePersistentVolumeClaim" "false") -}}
{{- else -}}
{{- $args = concat $args (list "--master" $job.master) -}}
{{- end -}}
{{- range $key, $value := $job.conf -}}
{{- $conf = append $conf (list $key (toString $value)) -}}
{{- end -}}
{{- range $conf -}}
{{- $args = concat $args (list "--conf" (printf "%s=%s" (index . 0) (index . 1))) -}}
{{- end -}}
{{- toYaml $args -}}
{{- end -}}

{{/* The environment of drivers and executors: the brokers' address, the stores' S3
settings and credentials (the brokers' own, gazette.s3.env), then the job's env. */}}
{{- define "gazette.spark.env" -}}
- {name: GAZETTE_BROKER_ADDRESS, value: {{ include "gazette.broker.address" .ctx | quote }}}
{{ include "gazette.s3.env" .ctx }}
{{- with .job.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* What the driver's and the executors' pods share: the image's user, the pull
secrets, the job's scheduling. (Both also mount emptyDirs on /tmp, Spark's local dirs and
the JVM's files, and on the home directory, the working directory: the root is
read-only.) */}}
{{- define "gazette.spark.podCommon" -}}
securityContext:
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- include "gazette.scheduling" .job }}
{{- end -}}

{{/* A Job's spec (a Job's, or a CronJob's jobTemplate's). */}}
{{- define "gazette.spark.jobSpec" -}}
{{- $job := .job -}}
backoffLimit: {{ $job.backoffLimit }}
{{- if not (kindIs "invalid" $job.ttlSecondsAfterFinished) }}
ttlSecondsAfterFinished: {{ $job.ttlSecondsAfterFinished }}
{{- end }}
{{- if not (kindIs "invalid" $job.activeDeadlineSeconds) }}
activeDeadlineSeconds: {{ $job.activeDeadlineSeconds }}
{{- end }}
template:
  metadata:
    labels:
      {{- include "gazette.labels" .labels | nindent 6 }}
    {{- with $job.podAnnotations }}
    annotations:
      {{- toYaml . | nindent 6 }}
    {{- end }}
  spec:
    # A failed attempt's pod stays (with its logs); backoffLimit retries in a new pod.
    restartPolicy: Never
    {{- if $job.k8s }}
    # The driver creates its executor pods through the API (the Role's rights).
    serviceAccountName: {{ .serviceAccount }}
    automountServiceAccountToken: true
    {{- else }}
    automountServiceAccountToken: false
    {{- end }}
    {{- include "gazette.spark.podCommon" . | nindent 4 }}
    containers:
      - name: spark
        image: {{ .image }}
        imagePullPolicy: {{ .pullPolicy }}
        # After the image's `python` entrypoint.
        args:
          {{- include "gazette.spark.args" . | nindent 10 }}
        env:
          {{- if $job.k8s }}
          # The driver's address for executors (spark.driver.host), and its pod, which
          # owns the executor pods (they go when it goes).
          - name: POD_IP
            valueFrom: {fieldRef: {fieldPath: status.podIP}}
          - name: POD_NAME
            valueFrom: {fieldRef: {fieldPath: metadata.name}}
          {{- end }}
          {{- include "gazette.spark.env" . | nindent 10 }}
        securityContext:
          {{- include "gazette.containerSecurityContext" . | nindent 10 }}
        resources:
          {{- toYaml $job.resources | nindent 10 }}
        volumeMounts:
          - {name: tmp, mountPath: /tmp}
          - {name: home, mountPath: /home/gazette}
          {{- if $job.k8s }}
          - {name: executor-template, mountPath: {{ include "gazette.spark.templateDir" . }}, readOnly: true}
          {{- end }}
    volumes:
      - name: tmp
        emptyDir: {}
      - name: home
        emptyDir: {}
      {{- if $job.k8s }}
      - name: executor-template
        configMap: {name: {{ printf "%s-executor" $job.fullname }}}
      {{- end }}
{{- end -}}

{{/* The command of an executor pod: Spark's executor backend on the image's JRE, with
pyspark's jars, as the entrypoint of Spark's own images does. Spark passes its settings
in the environment (SPARK_DRIVER_URL, SPARK_EXECUTOR_*, the JVM options as
SPARK_JAVA_OPT_0, _1, ...) and appends the argument `executor` ($0 here). */}}
{{- define "gazette.spark.executorScript" -}}
set -eo pipefail
jars="$(python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
opts=()
i=0
while v="SPARK_JAVA_OPT_$i" && [ -n "${!v+x}" ]; do opts+=("${!v}"); i=$((i + 1)); done
exec "$JAVA_HOME/bin/java" "${opts[@]}" \
  -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
  -cp "${SPARK_CONF_DIR:+$SPARK_CONF_DIR:}${SPARK_CLASSPATH:+$SPARK_CLASSPATH:}$jars/*:$PWD" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" \
  --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID" \
  --hostname "$SPARK_EXECUTOR_POD_IP" --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
  --podName "$SPARK_EXECUTOR_POD_NAME"
{{- end -}}

{{/* The executors' pod template. Spark sets the image, resources and its env on the
first container and keeps the rest: the command, the stores' credentials, no API token
(executors never call the API, though Spark gives them the driver's account). */}}
{{- define "gazette.spark.executorPod" -}}
apiVersion: v1
kind: Pod
metadata:
  labels:
    {{- include "gazette.labels" (dict "ctx" .ctx "component" (printf "%s-executor" .labels.component | trunc 63 | trimSuffix "-")) | nindent 4 }}
spec:
  automountServiceAccountToken: false
  {{- include "gazette.spark.podCommon" . | nindent 2 }}
  containers:
    - name: executor
      image: {{ .image }}
      imagePullPolicy: {{ .pullPolicy }}
      command:
        - bash
        - -c
        - |
          {{- include "gazette.spark.executorScript" . | nindent 10 }}
      env:
        {{- include "gazette.spark.env" . | nindent 8 }}
      securityContext:
        {{- include "gazette.containerSecurityContext" . | nindent 8 }}
      volumeMounts:
        - {name: tmp, mountPath: /tmp}
        - {name: home, mountPath: /home/gazette}
  volumes:
    - name: tmp
      emptyDir: {}
    - name: home
      emptyDir: {}
{{- end -}}

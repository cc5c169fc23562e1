/*
 * Eclipse Paho C (synchronous MQTTClient, -lpaho-mqtt3c) as a Postbox client, driven by
 * tests/suite/interop.rs, which compiles it into a temporary directory.
 *
 * Used the way the library's samples do: MQTTClient_create, MQTTClient_setCallbacks (messages
 * arrive on the library's thread), MQTTClient_connect (returns after CONNACK: this client does
 * not pipeline behind CONNECT), subscribe, MQTTClient_publishMessage + waitForCompletion,
 * MQTTClient_disconnect. MQTT 3.1.1.
 *
 * Usage: client SCENARIO tcp://127.0.0.1:PORT ID. Output: one JSON object per line (event:
 * connack, subscribed, message, published, end, error); exit 0 when every wait was met.
 * Every wait is bounded (WAIT_MS).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <MQTTClient.h>

#define WAIT_MS 10000L

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t arrived = PTHREAD_COND_INITIALIZER;
static int received = 0;
static const char *uri;
static const char *id;

static void fail(const char *what, int rc) {
    printf("{\"event\":\"error\",\"what\":\"%s\",\"rc\":%d}\n", what, rc);
    fflush(stdout);
    exit(1);
}

/* A JSON string of printable ASCII (the tests' topics and payloads are). */
static void json_str(const char *s, int len) {
    putchar('"');
    for (int i = 0; i < len; i++) {
        char c = s[i];
        if (c == '"' || c == '\\') putchar('\\');
        putchar(c >= 32 && c < 127 ? c : '?');
    }
    putchar('"');
}

static int on_message(void *ctx, char *topic, int topic_len, MQTTClient_message *m) {
    (void)ctx;
    pthread_mutex_lock(&lock);
    printf("{\"event\":\"message\",\"topic\":");
    json_str(topic, topic_len ? topic_len : (int)strlen(topic));
    printf(",\"payload\":");
    json_str(m->payload, m->payloadlen);
    printf(",\"qos\":%d,\"retain\":%s,\"props\":{}}\n", m->qos, m->retained ? "true" : "false");
    fflush(stdout);
    received++;
    pthread_cond_broadcast(&arrived);
    pthread_mutex_unlock(&lock);
    MQTTClient_freeMessage(&m);
    MQTTClient_free(topic);
    return 1;
}

static void on_lost(void *ctx, char *cause) {
    (void)ctx;
    (void)cause;
}

static void wait_messages(int n, const char *what) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WAIT_MS / 1000;
    pthread_mutex_lock(&lock);
    while (received < n) {
        if (pthread_cond_timedwait(&arrived, &lock, &until) != 0) {
            pthread_mutex_unlock(&lock);
            fail(what, received);
        }
    }
    pthread_mutex_unlock(&lock);
}

/* Creates and connects `suffix` (clean or persistent session, optional will on `will`). */
static MQTTClient open_client(const char *suffix, int clean, const char *will_topic) {
    char cid[128];
    snprintf(cid, sizeof cid, "%s-%s", id, suffix);
    MQTTClient c;
    int rc = MQTTClient_create(&c, uri, cid, MQTTCLIENT_PERSISTENCE_NONE, NULL);
    if (rc != MQTTCLIENT_SUCCESS) fail("create", rc);
    MQTTClient_setCallbacks(c, NULL, on_lost, on_message, NULL);
    MQTTClient_connectOptions o = MQTTClient_connectOptions_initializer;
    MQTTClient_willOptions w = MQTTClient_willOptions_initializer;
    o.keepAliveInterval = 30;
    o.cleansession = clean;
    o.MQTTVersion = MQTTVERSION_3_1_1;
    if (will_topic) {
        w.topicName = will_topic;
        w.message = strstr(will_topic, "unclean") ? "unclean-will" : "clean-will";
        w.qos = 1;
        o.will = &w;
    }
    rc = MQTTClient_connect(c, &o);
    if (rc != MQTTCLIENT_SUCCESS) fail("connect", rc);
    printf("{\"event\":\"connack\",\"rc\":0,\"client\":\"%s\"}\n", cid);
    fflush(stdout);
    return c;
}

static void subscribe(MQTTClient c, const char *topic, int qos) {
    int rc = MQTTClient_subscribe(c, topic, qos);
    if (rc != MQTTCLIENT_SUCCESS) fail("subscribe", rc);
    printf("{\"event\":\"subscribed\",\"codes\":[%d]}\n", qos);
    fflush(stdout);
}

static void publish(MQTTClient c, const char *topic, const char *payload, int qos, int retain) {
    MQTTClient_message m = MQTTClient_message_initializer;
    MQTTClient_deliveryToken token;
    m.payload = (void *)payload;
    m.payloadlen = (int)strlen(payload);
    m.qos = qos;
    m.retained = retain;
    int rc = MQTTClient_publishMessage(c, topic, &m, &token);
    if (rc != MQTTCLIENT_SUCCESS) fail("publish", rc);
    if (qos > 0) {
        rc = MQTTClient_waitForCompletion(c, token, WAIT_MS);
        if (rc != MQTTCLIENT_SUCCESS) fail("publish completes", rc);
    }
}

static void end(MQTTClient c) {
    int rc = MQTTClient_disconnect(c, 1000);
    printf("{\"event\":\"end\",\"rc\":%d}\n", rc);
    fflush(stdout);
    MQTTClient_destroy(&c);
    if (rc != MQTTCLIENT_SUCCESS) exit(1);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: client SCENARIO URI ID\n");
        return 2;
    }
    const char *scenario = argv[1];
    const char *self = argv[0];
    uri = argv[2];
    id = argv[3];
    char t[256];
    if (strcmp(scenario, "basic") == 0) {
        MQTTClient c = open_client("basic", 1, NULL);
        snprintf(t, sizeof t, "t/%s/#", id);
        subscribe(c, t, 2);
        for (int q = 0; q <= 2; q++) {
            char payload[8];
            snprintf(t, sizeof t, "t/%s/q%d", id, q);
            snprintf(payload, sizeof payload, "q%d", q);
            publish(c, t, payload, q, 0);
        }
        wait_messages(3, "QoS 0/1/2 round trips");
        snprintf(t, sizeof t, "r/%s", id);
        publish(c, t, "retained", 1, 1);
        subscribe(c, t, 1);
        wait_messages(4, "retained message on a later subscription");
        end(c);
    } else if (strcmp(scenario, "will") == 0) {
        MQTTClient watcher = open_client("watch", 1, NULL);
        snprintf(t, sizeof t, "w/%s/#", id);
        subscribe(watcher, t, 1);
        snprintf(t, sizeof t, "w/%s/clean", id);
        end(open_client("clean", 1, t));
        int ready[2];
        if (pipe(ready) != 0) fail("pipe", 0);
        /* A process of its own (fork + exec: the library's threads do not survive a fork). */
        pid_t child = fork();
        if (child == 0) {
            dup2(ready[1], STDOUT_FILENO);
            execl(self, self, "will-child", uri, id, (char *)NULL);
            _exit(1);
        }
        close(ready[1]); /* a child that dies first ends the read below */
        char byte;
        /* The child's first output is its connack line. */
        if (read(ready[0], &byte, 1) != 1) fail("will child connects", 0);
        kill(child, SIGKILL); /* the socket closes without DISCONNECT */
        waitpid(child, NULL, 0);
        wait_messages(1, "the will of the killed client");
        snprintf(t, sizeof t, "w/%s/fence", id);
        publish(watcher, t, "fence", 1, 0);
        wait_messages(2, "fence");
        end(watcher);
    } else if (strcmp(scenario, "will-child") == 0) {
        snprintf(t, sizeof t, "w/%s/unclean", id);
        open_client("unclean", 1, t);
        sleep(30); /* until killed (bounded) */
        return 1;
    } else if (strcmp(scenario, "session-sub") == 0) {
        MQTTClient c = open_client("sess", 0, NULL);
        snprintf(t, sizeof t, "s/%s", id);
        subscribe(c, t, 1);
        end(c);
    } else if (strcmp(scenario, "session-pub") == 0) {
        MQTTClient c = open_client("pub", 1, NULL);
        snprintf(t, sizeof t, "s/%s", id);
        publish(c, t, "m1", 1, 0);
        publish(c, t, "m2", 1, 0);
        publish(c, t, "m3", 1, 0);
        printf("{\"event\":\"published\",\"n\":3}\n");
        end(c);
    } else if (strcmp(scenario, "session-resume") == 0) {
        MQTTClient c = open_client("sess", 0, NULL);
        wait_messages(3, "queued QoS 1 messages after the restart");
        end(c);
    } else {
        fail("unknown scenario", 0);
    }
    return 0;
}

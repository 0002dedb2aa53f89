/* Preloaded into a client (wrk) that cannot choose its source address: each IPv4 connect()
 * is made from the next of BIND_COUNT addresses from BIND_FIRST, in turn, so that one
 * client's connections come from as many addresses of a network (tests/system/test_wrk_floods.py).
 * Built by testkit/wrk.py. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>

static atomic_uint next_source;

int connect(int fd, const struct sockaddr *address, socklen_t length) {
    static int (*real_connect)(int, const struct sockaddr *, socklen_t);
    if (real_connect == NULL) {
        real_connect = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
    }
    const char *first = getenv("BIND_FIRST");
    const char *count = getenv("BIND_COUNT");
    if (address->sa_family == AF_INET && first != NULL && count != NULL && atoi(count) > 0) {
        struct sockaddr_in source = {.sin_family = AF_INET, .sin_port = 0};
        unsigned n = atomic_fetch_add(&next_source, 1) % (unsigned)atoi(count);
        source.sin_addr.s_addr = htonl(ntohl(inet_addr(first)) + n);
        (void)bind(fd, (const struct sockaddr *)&source, sizeof source);
    }
    return real_connect(fd, address, length);
}

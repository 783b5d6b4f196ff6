/* A slow disk for one process: while the file named by IDEM_SYNC_STALL_FILE
 * holds a number of milliseconds, every fsync and fdatasync of the process
 * waits that long before the real call. Loaded with LD_PRELOAD by
 * idem_testkit::disk_stall, so a test can stall the durable commits of the
 * real binary the way a saturated or failing disk does. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void stall(void) {
    const char *path = getenv("IDEM_SYNC_STALL_FILE");
    if (path == NULL) {
        return;
    }
    FILE *file = fopen(path, "r");
    if (file == NULL) {
        return;
    }
    long ms = 0;
    if (fscanf(file, "%ld", &ms) != 1) {
        ms = 0;
    }
    fclose(file);
    if (ms <= 0) {
        return;
    }
    struct timespec left = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&left, &left) != 0) {
    }
}

int fsync(int fd) {
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    stall();
    return real(fd);
}

int fdatasync(int fd) {
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    stall();
    return real(fd);
}

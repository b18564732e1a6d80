/* Runs files through a fuzz target without libFuzzer: every file named,
 * and every file in every directory named (not recursive).  Used by the
 * tests to replay the corpus and the crash files with any compiler, under
 * the sanitizers.  Prints "replayed N inputs" and exits 0, unless a target
 * crashes (then the sanitizer's report and its exit status stand). */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long replayed;

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    uint8_t *data = NULL;
    size_t size = 0, capacity = 0;
    for (;;) {
        if (size == capacity) {
            capacity = capacity ? 2 * capacity : 1 << 16;
            uint8_t *grown = realloc(data, capacity);
            if (!grown) {
                free(data);
                fclose(f);
                return -1;
            }
            data = grown;
        }
        size_t got = fread(data + size, 1, capacity - size, f);
        if (got == 0)
            break;
        size += got;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    replayed++;
    return 0;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 2;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[i]) != 0)
                return 2;
            continue;
        }
        DIR *dir = opendir(argv[i]);
        if (!dir) {
            perror(argv[i]);
            return 2;
        }
        struct dirent *entry;
        while ((entry = readdir(dir)) != NULL) {
            if (entry->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], entry->d_name);
            if (run_file(path) != 0) {
                closedir(dir);
                return 2;
            }
        }
        closedir(dir);
    }
    printf("replayed %ld inputs\n", replayed);
    return 0;
}

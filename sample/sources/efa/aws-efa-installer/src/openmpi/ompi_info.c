/*
 * ompi_info: reports the Open MPI build, in Open MPI's layout.
 */

#include <mpi.h>

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define OMPI_VERSION_STRING "@@OMPI_VERSION@@"
#define OMPI_RELEASE_DATE "@@OMPI_RELEASE_DATE@@"

/* The prefix is wherever this binary was installed: <prefix>/bin/ompi_info. */
static void find_prefix(char *prefix, size_t size)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	snprintf(prefix, size, "/opt/amazon/openmpi");
	if (n <= 0)
		return;
	exe[n] = '\0';
	for (int i = 0; i < 2; i++) {
		char *slash = strrchr(exe, '/');
		if (slash == NULL)
			return;
		*slash = '\0';
	}
	snprintf(prefix, size, "%s", exe[0] ? exe : "/");
}

static void row(const char *key, const char *value)
{
	printf("%24s: %s\n", key, value);
}

int main(int argc, char **argv)
{
	char prefix[PATH_MAX];
	char library[MPI_MAX_LIBRARY_VERSION_STRING];
	int len = 0;

	if (argc > 1 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0)) {
		printf("Open MPI v%s\n\nhttp://www.open-mpi.org/community/help/\n", OMPI_VERSION_STRING);
		return 0;
	}
	if (argc > 1 && strcmp(argv[1], "--parsable") != 0 && strcmp(argv[1], "--all") != 0 &&
	    strcmp(argv[1], "-a") != 0) {
		fprintf(stderr, "%s: unrecognized option '%s'\n", argv[0], argv[1]);
		return 1;
	}
	find_prefix(prefix, sizeof(prefix));
	MPI_Get_library_version(library, &len);
	row("Package", "Open MPI (sample build)");
	row("Open MPI", OMPI_VERSION_STRING);
	row("Open MPI repo revision", "v" OMPI_VERSION_STRING);
	row("Open MPI release date", OMPI_RELEASE_DATE);
	row("MPI API", "3.1.0");
	row("Prefix", prefix);
	row("Configured architecture", "x86_64-pc-linux-gnu");
	row("C bindings", "yes");
	row("Thread support", "posix (MPI_THREAD_MULTIPLE: yes)");
	row("MCA mtl", "ofi (MCA v2.1.0, API v2.0.0, Component v" OMPI_VERSION_STRING ")");
	row("Library", library);
	return 0;
}

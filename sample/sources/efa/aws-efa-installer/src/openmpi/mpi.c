/*
 * Sample Open MPI library (libmpi.so.40). See include/mpi.h for what it models.
 */

#include <mpi.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define OMPI_VERSION_STRING "@@OMPI_VERSION@@"

static int initialized;
static int finalized;
static int world_rank;
static int world_size = 1;

static int env_int(const char *name, int fallback)
{
	const char *value = getenv(name);
	if (value == NULL || *value == '\0')
		return fallback;
	char *end = NULL;
	long parsed = strtol(value, &end, 10);
	return (end && *end == '\0' && parsed >= 0) ? (int)parsed : fallback;
}

int MPI_Init(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	if (initialized) {
		fprintf(stderr, "MPI_Init: MPI has already been initialized\n");
		return MPI_ERR_OTHER;
	}
	world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
	world_rank = env_int("OMPI_COMM_WORLD_RANK", 0);
	if (world_size < 1 || world_rank >= world_size) {
		fprintf(stderr, "MPI_Init: inconsistent rank %d of %d\n", world_rank, world_size);
		return MPI_ERR_OTHER;
	}
	initialized = 1;
	return MPI_SUCCESS;
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
	if (provided)
		*provided = required;
	return MPI_Init(argc, argv);
}

int MPI_Initialized(int *flag)
{
	*flag = initialized;
	return MPI_SUCCESS;
}

int MPI_Finalize(void)
{
	finalized = 1;
	return MPI_SUCCESS;
}

int MPI_Finalized(int *flag)
{
	*flag = finalized;
	return MPI_SUCCESS;
}

int MPI_Abort(MPI_Comm comm, int errorcode)
{
	(void)comm;
	fprintf(stderr, "MPI_ABORT was invoked on rank %d in communicator MPI_COMM_WORLD\n"
		"with errorcode %d.\n", world_rank, errorcode);
	exit(errorcode);
}

static int check_comm(MPI_Comm comm)
{
	if (!initialized)
		return MPI_ERR_OTHER;
	return (comm == MPI_COMM_WORLD || comm == MPI_COMM_SELF) ? MPI_SUCCESS : MPI_ERR_COMM;
}

int MPI_Comm_rank(MPI_Comm comm, int *rank)
{
	int ret = check_comm(comm);
	if (ret == MPI_SUCCESS)
		*rank = comm == MPI_COMM_SELF ? 0 : world_rank;
	return ret;
}

int MPI_Comm_size(MPI_Comm comm, int *size)
{
	int ret = check_comm(comm);
	if (ret == MPI_SUCCESS)
		*size = comm == MPI_COMM_SELF ? 1 : world_size;
	return ret;
}

int MPI_Get_version(int *version, int *subversion)
{
	*version = MPI_VERSION;
	*subversion = MPI_SUBVERSION;
	return MPI_SUCCESS;
}

int MPI_Get_library_version(char *version, int *resultlen)
{
	int n = snprintf(version, MPI_MAX_LIBRARY_VERSION_STRING,
			 "Open MPI v%s, package: Open MPI (sample build), ident: %s, repo rev: v%s",
			 OMPI_VERSION_STRING, OMPI_VERSION_STRING, OMPI_VERSION_STRING);
	*resultlen = n < MPI_MAX_LIBRARY_VERSION_STRING ? n : MPI_MAX_LIBRARY_VERSION_STRING - 1;
	return MPI_SUCCESS;
}

int MPI_Get_processor_name(char *name, int *resultlen)
{
	if (gethostname(name, MPI_MAX_PROCESSOR_NAME) != 0)
		snprintf(name, MPI_MAX_PROCESSOR_NAME, "localhost");
	name[MPI_MAX_PROCESSOR_NAME - 1] = '\0';
	*resultlen = (int)strlen(name);
	return MPI_SUCCESS;
}

int MPI_Barrier(MPI_Comm comm)
{
	return check_comm(comm);
}

static size_t type_size(MPI_Datatype type)
{
	switch (type) {
	case MPI_CHAR:
	case MPI_BYTE:
		return 1;
	case MPI_INT:
	case MPI_UNSIGNED:
	case MPI_FLOAT:
		return 4;
	case MPI_LONG:
	case MPI_UNSIGNED_LONG:
	case MPI_LONG_LONG:
	case MPI_UNSIGNED_LONG_LONG:
	case MPI_DOUBLE:
		return 8;
	default:
		return 0;
	}
}

int MPI_Bcast(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm)
{
	(void)buffer;
	if (count < 0 || type_size(datatype) == 0 || root < 0 || root >= world_size)
		return MPI_ERR_ARG;
	return check_comm(comm);
}

/* Folds x with itself n times: what op gives when all n ranks contribute x. */
#define FOLD(T, x, op, n) do {                                                \
	T acc_ = (x);                                                          \
	for (int r_ = 1; r_ < (n); r_++) {                                     \
		switch (op) {                                                  \
		case MPI_SUM: acc_ = (T)(acc_ + (x)); break;                   \
		case MPI_PROD: acc_ = (T)(acc_ * (x)); break;                  \
		case MPI_LAND: acc_ = (T)(acc_ && (x)); break;                 \
		case MPI_LOR: acc_ = (T)(acc_ || (x)); break;                  \
		default: break; /* MAX, MIN: x itself */                       \
		}                                                              \
	}                                                                      \
	(x) = acc_;                                                            \
} while (0)

static void fold_buffer(void *buf, int count, MPI_Datatype type, MPI_Op op, int n)
{
	for (int i = 0; i < count; i++) {
		switch (type) {
		case MPI_CHAR: FOLD(char, ((char *)buf)[i], op, n); break;
		case MPI_BYTE: FOLD(unsigned char, ((unsigned char *)buf)[i], op, n); break;
		case MPI_INT: FOLD(int, ((int *)buf)[i], op, n); break;
		case MPI_UNSIGNED: FOLD(unsigned, ((unsigned *)buf)[i], op, n); break;
		case MPI_LONG: FOLD(long, ((long *)buf)[i], op, n); break;
		case MPI_UNSIGNED_LONG: FOLD(unsigned long, ((unsigned long *)buf)[i], op, n); break;
		case MPI_LONG_LONG: FOLD(long long, ((long long *)buf)[i], op, n); break;
		case MPI_UNSIGNED_LONG_LONG:
			FOLD(unsigned long long, ((unsigned long long *)buf)[i], op, n);
			break;
		case MPI_FLOAT: FOLD(float, ((float *)buf)[i], op, n); break;
		case MPI_DOUBLE: FOLD(double, ((double *)buf)[i], op, n); break;
		default: break;
		}
	}
}

int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype,
		  MPI_Op op, MPI_Comm comm)
{
	int ret = check_comm(comm);
	size_t size = type_size(datatype);
	if (ret != MPI_SUCCESS)
		return ret;
	if (count < 0 || size == 0)
		return MPI_ERR_ARG;
	if (op < MPI_MAX || op > MPI_LOR)
		return MPI_ERR_OP;
	if (sendbuf != MPI_IN_PLACE)
		memcpy(recvbuf, sendbuf, size * (size_t)count);
	fold_buffer(recvbuf, count, datatype, op, comm == MPI_COMM_SELF ? 1 : world_size);
	return MPI_SUCCESS;
}

int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype,
		  void *recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm)
{
	int ret = check_comm(comm);
	if (ret != MPI_SUCCESS)
		return ret;
	size_t block = type_size(recvtype) * (size_t)recvcount;
	int n = comm == MPI_COMM_SELF ? 1 : world_size;
	const char *src = sendbuf == MPI_IN_PLACE ? (const char *)recvbuf + block * world_rank
						  : (const char *)sendbuf;
	if (sendbuf != MPI_IN_PLACE && type_size(sendtype) * (size_t)sendcount != block)
		return MPI_ERR_COUNT;
	char *tmp = malloc(block ? block : 1);
	if (tmp == NULL)
		return MPI_ERR_OTHER;
	memcpy(tmp, src, block);
	for (int r = 0; r < n; r++)
		memcpy((char *)recvbuf + block * r, tmp, block);
	free(tmp);
	return MPI_SUCCESS;
}

int MPI_Send(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm)
{
	(void)buf;
	(void)tag;
	if (count < 0 || type_size(datatype) == 0 || dest < 0 || dest >= world_size)
		return MPI_ERR_ARG;
	return check_comm(comm);
}

int MPI_Recv(void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
	     MPI_Status *status)
{
	if (count < 0 || type_size(datatype) == 0)
		return MPI_ERR_ARG;
	memset(buf, 0, type_size(datatype) * (size_t)count);
	if (status) {
		status->MPI_SOURCE = source;
		status->MPI_TAG = tag;
		status->MPI_ERROR = MPI_SUCCESS;
	}
	return check_comm(comm);
}

double MPI_Wtime(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

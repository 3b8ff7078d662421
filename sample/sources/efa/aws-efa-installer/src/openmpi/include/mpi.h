/*
 * Sample Open MPI header: the MPI subset that nccl-tests and aws-ofi-nccl's tests use.
 * Processes started by the sample mpirun learn their rank from OMPI_COMM_WORLD_RANK and
 * OMPI_COMM_WORLD_SIZE; there is no transport, and every rank is taken to hold the same
 * data, so reductions fold a value with itself.
 */

#ifndef OMPI_MPI_H
#define OMPI_MPI_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OPEN_MPI 1
#define OMPI_MAJOR_VERSION @@OMPI_MAJOR@@
#define OMPI_MINOR_VERSION @@OMPI_MINOR@@
#define OMPI_RELEASE_VERSION @@OMPI_RELEASE@@

#define MPI_VERSION 3
#define MPI_SUBVERSION 1

#define MPI_SUCCESS 0
#define MPI_ERR_BUFFER 1
#define MPI_ERR_COUNT 2
#define MPI_ERR_TYPE 3
#define MPI_ERR_COMM 5
#define MPI_ERR_OP 9
#define MPI_ERR_ARG 13
#define MPI_ERR_OTHER 16

#define MPI_MAX_PROCESSOR_NAME 256
#define MPI_MAX_LIBRARY_VERSION_STRING 256

#define MPI_THREAD_SINGLE 0
#define MPI_THREAD_FUNNELED 1
#define MPI_THREAD_SERIALIZED 2
#define MPI_THREAD_MULTIPLE 3

typedef int MPI_Comm;
#define MPI_COMM_NULL ((MPI_Comm)0)
#define MPI_COMM_WORLD ((MPI_Comm)1)
#define MPI_COMM_SELF ((MPI_Comm)2)

typedef int MPI_Datatype;
#define MPI_DATATYPE_NULL ((MPI_Datatype)0)
#define MPI_CHAR ((MPI_Datatype)1)
#define MPI_BYTE ((MPI_Datatype)2)
#define MPI_INT ((MPI_Datatype)3)
#define MPI_UNSIGNED ((MPI_Datatype)4)
#define MPI_LONG ((MPI_Datatype)5)
#define MPI_UNSIGNED_LONG ((MPI_Datatype)6)
#define MPI_LONG_LONG ((MPI_Datatype)7)
#define MPI_UNSIGNED_LONG_LONG ((MPI_Datatype)8)
#define MPI_FLOAT ((MPI_Datatype)9)
#define MPI_DOUBLE ((MPI_Datatype)10)
#define MPI_UINT64_T MPI_UNSIGNED_LONG_LONG
#define MPI_INT64_T MPI_LONG_LONG

typedef int MPI_Op;
#define MPI_OP_NULL ((MPI_Op)0)
#define MPI_MAX ((MPI_Op)1)
#define MPI_MIN ((MPI_Op)2)
#define MPI_SUM ((MPI_Op)3)
#define MPI_PROD ((MPI_Op)4)
#define MPI_LAND ((MPI_Op)5)
#define MPI_LOR ((MPI_Op)6)

#define MPI_IN_PLACE ((void *)1)

typedef struct {
	int MPI_SOURCE;
	int MPI_TAG;
	int MPI_ERROR;
} MPI_Status;

int MPI_Init(int *argc, char ***argv);
int MPI_Init_thread(int *argc, char ***argv, int required, int *provided);
int MPI_Initialized(int *flag);
int MPI_Finalize(void);
int MPI_Finalized(int *flag);
int MPI_Abort(MPI_Comm comm, int errorcode);
int MPI_Comm_rank(MPI_Comm comm, int *rank);
int MPI_Comm_size(MPI_Comm comm, int *size);
int MPI_Get_version(int *version, int *subversion);
int MPI_Get_library_version(char *version, int *resultlen);
int MPI_Get_processor_name(char *name, int *resultlen);
int MPI_Barrier(MPI_Comm comm);
int MPI_Bcast(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm);
int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype,
		  MPI_Op op, MPI_Comm comm);
int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype,
		  void *recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm);
int MPI_Send(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm);
int MPI_Recv(void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
	     MPI_Status *status);
double MPI_Wtime(void);

#ifdef __cplusplus
}
#endif

#endif /* OMPI_MPI_H */
